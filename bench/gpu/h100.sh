#!/usr/bin/env bash
# The checks of a lent GPU machine, in one run: `vgpu doctor` (bench/gpu/doctor.sh), the device plugin's NVML
# backend (bench/gpu/nvml_backend.py), what a pair of CUDA events reads (bench/gpu/event_timing.c) and, where
# PyTorch can be imported, tenants sharing the GPU with and without the node's pacer (bench/gpu/tenants.py --paced,
# about 200 s), from a plain checkout,
# nothing installed.
#
# From the repository root:  OUT=/some/folder bench/gpu/h100.sh [doctor flags, e.g. --quick]
# $OUT receives doctor.json, doctor.txt, system.txt (from doctor.sh), nvml_backend.json, event_timing.txt,
# tenants.json and h100.log (this script's own lines). cuda.h is looked for in $CUDA_INCLUDE, /usr/local/cuda/include, then nvcc's folder.
# Exit status: the doctor's (0 limits hold, 1 a limit broken, 2 it could not start, 124 its timeout).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$PWD/h100-out}
python=${PYTHON:-python3}
mkdir -p "$out"
log="$out/h100.log"
: >"$log"

include=${CUDA_INCLUDE:-}
for candidate in "$include" /usr/local/cuda/include "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")/../include"; do
  if [ -n "$candidate" ] && [ -f "$candidate/cuda.h" ]; then include=$candidate; break; fi
done
echo "cuda.h from: ${include:-not found}" | tee -a "$log"

started=$(date +%s)
OUT="$out" CUDA_INCLUDE="$include" DOCTOR_TIMEOUT=${DOCTOR_TIMEOUT:-330} "$root/bench/gpu/doctor.sh" "$@"
status=$?
echo "doctor: exit $status after $(( $(date +%s) - started )) s" | tee -a "$log"

work=$(mktemp -d "${TMPDIR:-/tmp}/vgpu-h100.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/vgpu"
for f in "$root"/vgpu/*; do ln -s "$f" "$work/vgpu/"; done
ln -s "$root/node" "$work/vgpu/node"
ln -s "$root/isolation" "$work/vgpu/isolation"   # the accounting region's reader, for the tenants' pacer
(cd "$work" && PYTHONPATH="$work" timeout -k 5 60 "$python" "$root/bench/gpu/nvml_backend.py") \
  >"$out/nvml_backend.json" 2>>"$log"
echo "nvml backend: exit $?" | tee -a "$log"
if gcc -O2 -I"$include" "$root/bench/gpu/event_timing.c" -ldl -o "$work/event_timing" 2>>"$log"; then
  timeout -k 5 120 "$work/event_timing" >"$out/event_timing.txt" 2>>"$log"
  echo "event timing: exit $?" | tee -a "$log"
fi
if "$python" -c "import torch" 2>/dev/null \
    && make -s -C "$root/isolation" BUILD="$work/build" CUDA_INCLUDE="$include" >>"$log" 2>&1; then
  PYTHONPATH="$work" timeout -k 5 420 "$python" "$root/bench/gpu/tenants.py" --lib "$work/build/libvgpu.so" --paced \
    >"$out/tenants.json" 2>>"$log"
  echo "tenants: exit $?" | tee -a "$log"
fi
exit "$status"
