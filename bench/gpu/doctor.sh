#!/usr/bin/env bash
# `vgpu doctor` on a GPU machine from a plain checkout: nothing installed, no network.
#
# From the repository root:  bench/gpu/doctor.sh [doctor flags, e.g. --quick]
# It builds libvgpu.so with `make -C isolation` (cuda.h from $CUDA_INCLUDE, default /usr/local/cuda/include) into
# a temporary folder, makes the `vgpu` package importable without installing it (a folder whose `vgpu/` links
# vgpu/'s files and `isolation` -> isolation/, put on PYTHONPATH), and runs
# `python3 -m vgpu.isolation.doctor --lib <that build> --json $OUT/doctor.json` under a total timeout
# ($DOCTOR_TIMEOUT, default 420 s). $OUT (default ./doctor-out) receives doctor.json, doctor.txt (what the doctor
# printed) and system.txt (nvidia-smi, python and framework versions, nvcc). Exit status: the doctor's (0 limits
# hold, 1 a limit is broken, 2 it could not start), 124 when the timeout ended it.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$PWD/doctor-out}
python=${PYTHON:-python3}
limit=${DOCTOR_TIMEOUT:-420}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/vgpu-doctor-sh.XXXXXX")
trap 'rm -rf "$work"' EXIT

{
  echo "== nvidia-smi"; nvidia-smi 2>&1 || true
  echo "== python"; "$python" --version 2>&1
  echo "== frameworks"
  "$python" - <<'PY' 2>&1
import importlib
for name in ("torch", "cupy", "jax", "jaxlib", "pynvml"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:  # report and go on: the doctor skips what is missing
        print(name, "not importable:", type(exc).__name__, exc)
PY
  echo "== nvcc"; nvcc --version 2>&1 || true
} >"$out/system.txt"

if ! make -s -C "$root/isolation" BUILD="$work/build" CUDA_INCLUDE="${CUDA_INCLUDE:-/usr/local/cuda/include}" \
    >"$work/make.log" 2>&1; then
  cat "$work/make.log" >&2
  echo "doctor.sh: building libvgpu.so failed" >&2
  exit 2
fi

mkdir -p "$work/path/vgpu"
for f in "$root"/vgpu/*; do
  ln -s "$f" "$work/path/vgpu/"
done
ln -s "$root/isolation" "$work/path/vgpu/isolation"

# run from the temporary folder: `python -m` puts the current directory first on sys.path, and the checkout's own
# vgpu/ (the core alone) must not hide the linked package
cd "$work" || exit 2
PYTHONPATH="$work/path${PYTHONPATH:+:$PYTHONPATH}" timeout -k 15 "$limit" \
  "$python" -m vgpu.isolation.doctor --lib "$work/build/libvgpu.so" --json "$out/doctor.json" "$@" 2>&1 \
  | tee "$out/doctor.txt"
status=${PIPESTATUS[0]}
if [ "$status" -eq 124 ]; then
  echo "doctor.sh: the doctor did not finish within $limit s" | tee -a "$out/doctor.txt" >&2
fi
exit "$status"
