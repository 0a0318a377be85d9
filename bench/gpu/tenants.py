"""Tenants sharing one real GPU under libvgpu.so: the matmul throughput each gets, as a % of the GPU's alone.

Run on a GPU machine with PyTorch (bench/gpu/h100.sh does): `python3 tenants.py --lib build/libvgpu.so`. Each
scenario starts its tenants together, one process each with its own accounting file and compute limit (memory
limit 8 GiB), as two pods on one GPU would be; each multiplies float32 matrices (TF32 off) in a loop and counts
the products completed in a common window, timed by CUDA events. The reference is the same loop alone without the
library. Prints one JSON document: per scenario and tenant, the limit and the rate as a % of the reference.
Standalone on purpose (only the standard library and torch): it runs from a plain checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WARMUP_S = 2.0
WINDOW_S = 4.0
START_DELAY_S = 10.0   # time for every tenant to import torch and set up before the common start
IN_FLIGHT = 16         # products queued before the loop waits for the GPU
SCENARIOS = {          # name: (matrix size, the tenants' compute limits)
    "large 30+50": (4096, [30, 50]),
    "large 50+50": (4096, [50, 50]),
    "large 20+20+20": (4096, [20, 20, 20]),
    "medium 30+50": (2048, [30, 50]),
    "small 30+50": (1024, [30, 50]),
}


def worker(n: int, start_at: float) -> None:
    """Products of n x n matrices completed per second of GPU time in the window that starts at `start_at` plus
    the warm-up; prints {"rate": ...}."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    torch.matmul(a, b)
    torch.cuda.synchronize()
    time.sleep(max(0.0, start_at - time.time()))
    stop_warmup = start_at + WARMUP_S
    while time.time() < stop_warmup:
        for _ in range(IN_FLIGHT):
            torch.matmul(a, b)
        torch.cuda.synchronize()
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    done = 0
    stop = stop_warmup + WINDOW_S
    while time.time() < stop:
        for _ in range(IN_FLIGHT):
            torch.matmul(a, b)
        done += IN_FLIGHT
        torch.cuda.synchronize()
    last.record()
    last.synchronize()
    print(json.dumps({"rate": done / (first.elapsed_time(last) / 1000.0), "products": done}))


def run(tenants: list[dict[str, str] | None], n: int, folder: str) -> list[float]:
    """Starts one worker per environment (None: no library) together; their rates."""
    start_at = time.time() + START_DELAY_S
    procs = []
    for i, extra in enumerate(tenants):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("CUDA_DEVICE_")}
        if extra is not None:
            env.update(extra, CUDA_DEVICE_MEMORY_SHARED_CACHE=os.path.join(folder, f"tenant{i}-{time.time_ns()}.cache"))
        procs.append(subprocess.Popen([sys.executable, __file__, "worker", str(n), str(start_at)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    rates = []
    for p in procs:
        out, err = p.communicate(timeout=START_DELAY_S + WARMUP_S + WINDOW_S + 60)
        if p.returncode != 0:
            raise SystemExit(f"tenants: a worker failed: {err.strip()[-500:]}")
        rates.append(float(json.loads(out.strip().splitlines()[-1])["rate"]))
    return rates


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), float(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="the libvgpu.so to preload")
    args = parser.parse_args()
    lib = os.path.abspath(args.lib)
    report: dict[str, object] = {"warmup_s": WARMUP_S, "window_s": WINDOW_S, "scenarios": {}}
    references: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, (n, limits) in SCENARIOS.items():
            if n not in references:
                references[n] = run([None], n, folder)[0]
                print(f"tenants: alone, {n}x{n}: {references[n]:.1f} products/s", file=sys.stderr)
            envs = [{"LD_PRELOAD": lib, "CUDA_DEVICE_SM_LIMIT": str(limit), "CUDA_DEVICE_MEMORY_LIMIT": "8g",
                     "GPU_CORE_UTILIZATION_POLICY": "force"} for limit in limits]
            rates = run(list(envs), n, folder)
            shares = [round(r / references[n] * 100, 1) for r in rates]
            report["scenarios"][name] = {"n": n, "limits": limits, "share_pct": shares,  # type: ignore[index]
                                         "products_per_s": [round(r, 1) for r in rates]}
            print(f"tenants: {name}: limits {limits} got {shares} %", file=sys.stderr)
    report["alone_products_per_s"] = {str(n): round(r, 1) for n, r in references.items()}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
