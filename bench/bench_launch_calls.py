"""Driver calls libvgpu.so adds per kernel launch under a compute limit (prints figures; never pass/fail).

The test bed's simulated driver counts every call made into it (simgpu_calls_total); `probe_api count KERNEL N`
launches a fixed-length kernel N times (short 20 us, medium 200 us, long 2 ms) with memory and compute limits on,
and reports the calls beyond the launches themselves, per launch.

    .venv/bin/python bench/bench_launch_calls.py [--limit 50] [--library path/to/other/libvgpu.so]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from vgpu.isolation.build import ensure_built
from vgpu.isolation.cuda_include import cuda_include_dir
from vgpu.testbed.build import ensure_sim_built

ROOT = Path(__file__).resolve().parents[1]
KERNELS = (("short", 20000), ("medium", 3000), ("long", 400))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=50, help="CUDA_DEVICE_SM_LIMIT (default 50)")
    ap.add_argument("--library", type=Path, default=None, help="another libvgpu.so to measure (default: ours)")
    a = ap.parse_args()
    library = a.library or ensure_built().libvgpu
    sim_dir = ensure_sim_built().sim_dir
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        probe = tmp / "probe_api"
        subprocess.run(["gcc", "-O2", "-pthread", f"-I{cuda_include_dir()}", f"-I{ROOT / 'isolation' / 'src'}",
                        "-o", str(probe), str(ROOT / "tests" / "isolation" / "csrc" / "probe_api.c"),
                        f"-L{sim_dir}", "-lcuda", "-ldl"], check=True)
        print(f"extra driver calls per launch, SM limit {a.limit} %, memory limit 4g; library {library}")
        print(f"{'kernel':8} {'launches':>9} {'calls':>9} {'extra/launch':>13}")
        for kernel, launches in KERNELS:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "GPU_CORE_"))}
            env.update(LD_LIBRARY_PATH=str(sim_dir), LD_PRELOAD=str(library), SIMGPU_STATE=str(tmp / f"{kernel}.state"),
                       CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / f"{kernel}.cache"), CUDA_DEVICE_MEMORY_LIMIT="4g",
                       CUDA_DEVICE_SM_LIMIT=str(a.limit), GPU_CORE_UTILIZATION_POLICY="force")
            res = subprocess.run([str(probe), "count", kernel, str(launches)], env=env, capture_output=True,
                                 text=True, timeout=600, check=True)
            kv = dict(line.split("=", 1) for line in res.stdout.split() if "=" in line)
            print(f"{kernel:8} {kv['launches']:>9} {kv['calls']:>9} {float(kv['extra_per_launch']):>13.3f}", flush=True)


if __name__ == "__main__":
    main()
