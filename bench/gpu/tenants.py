"""Tenants sharing one real GPU under libvgpu.so: the matmul throughput each gets, as a % of the GPU's alone.

Run on a GPU machine with PyTorch (bench/gpu/h100.sh does): `python3 tenants.py --lib build/libvgpu.so`. Each
scenario starts its tenants together, one process each with its own accounting file and compute limit (memory
limit 8 GiB), as two pods on one GPU would be; each multiplies float32 matrices (TF32 off) in a loop and counts
the products completed in a common window, timed by CUDA events. The reference is the same loop alone without the
library. Prints one JSON document: per scenario and tenant, the limit and the rate as a % of the reference.
Standalone on purpose (only the standard library and torch): it runs from a plain checkout.

`--paced` runs every scenario a second time with the node's pacer beside the tenants, as the device plugin runs it
(vgpu.node.pacing, once a second: NVML's per-process utilization of GPU 0 against each tenant's accounting file,
the factors written to each tenant's pace file); it needs the checkout's `vgpu` package on PYTHONPATH (h100.sh
links one), nvidia-ml-py and cffi, and reports `paced_share_pct` beside `share_pct`, or why it could not.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
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


def pace(procs: list[subprocess.Popen], caches: list[str], paces: list[str], limits: list[int],
         stop: threading.Event) -> None:
    """The node's pacer beside the tenants until `stop`: once a second, each tenant's real share of GPU 0 (NVML's
    per-process utilization) against what its library read (its accounting file), the factors into its pace file."""
    import pynvml as nv

    from vgpu.isolation.region import Region, RegionError
    from vgpu.node.backends.nvml import process_utilization
    from vgpu.node.pacing import Pacer, Tenant, pace_file_text

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    owner = {p.pid: f"t{i}" for i, p in enumerate(procs)}
    pacer, seen = Pacer(), 0
    while not stop.wait(1.0):
        tenants = []
        for i, limit in enumerate(limits):
            try:
                with Region.open(caches[i]) as region:
                    device = region.devices()[0]
            except (OSError, RegionError, IndexError):
                continue
            tenants.append(Tenant(f"t{i}", device.uuid, limit, device.charged_ns, read_ns=device.read_ns))
        try:
            running: dict[int, float] | None
            running, newest = process_utilization(nv, handle, seen)
            seen = newest or seen
        except nv.NVMLError:
            running = None
        factors = pacer.step(tenants, lambda _uuid, got=running: got, owner.get)
        for t in tenants:
            path = paces[int(t.key[1:])]
            with open(path + ".tmp", "w") as f:
                f.write(pace_file_text({t.uuid: factors[(t.key, t.uuid)]}))
            os.replace(path + ".tmp", path)


def run(tenants: list[dict[str, str] | None], n: int, folder: str, limits: list[int] | None = None) -> list[float]:
    """Starts one worker per environment (None: no library) together; their rates. With `limits` (one per tenant)
    the node's pacer runs beside them (`pace`)."""
    start_at = time.time() + START_DELAY_S
    procs, caches, paces = [], [], []
    for i, extra in enumerate(tenants):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("CUDA_DEVICE_")}
        stem = os.path.join(folder, f"tenant{i}-{time.time_ns()}")
        caches.append(stem + ".cache")
        paces.append(stem + ".pace")
        if extra is not None:
            env.update(extra, CUDA_DEVICE_MEMORY_SHARED_CACHE=caches[-1])
            if limits is not None:
                env["VGPU_PACE_FILE"] = paces[-1]
        procs.append(subprocess.Popen([sys.executable, __file__, "worker", str(n), str(start_at)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    stop = threading.Event()
    pacer = None
    if limits is not None:
        pacer = threading.Thread(target=pace, args=(procs, caches, paces, limits, stop), daemon=True)
        pacer.start()
    rates = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=START_DELAY_S + WARMUP_S + WINDOW_S + 60)
            if p.returncode != 0:
                raise SystemExit(f"tenants: a worker failed: {err.strip()[-500:]}")
            rates.append(float(json.loads(out.strip().splitlines()[-1])["rate"]))
    finally:
        stop.set()
        if pacer is not None:
            pacer.join(5)
    return rates


def pacing_unavailable() -> str:
    """Why the paced rows cannot run here ('' when they can)."""
    try:
        import pynvml  # noqa: F401

        from vgpu.isolation.region import Region  # noqa: F401
        from vgpu.node.pacing import Pacer  # noqa: F401
    except Exception as exc:   # a missing module, or cffi missing under the region reader
        return f"{type(exc).__name__}: {exc}"
    return ""


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), float(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="the libvgpu.so to preload")
    parser.add_argument("--paced", action="store_true", help="also run each scenario with the node's pacer")
    args = parser.parse_args()
    why = pacing_unavailable() if args.paced else ""
    if why:
        print(f"tenants: paced rows skipped: {why}", file=sys.stderr)
    lib = os.path.abspath(args.lib)
    report: dict[str, object] = {"warmup_s": WARMUP_S, "window_s": WINDOW_S, "scenarios": {}}
    if why:
        report["paced_skipped"] = why
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
            row: dict[str, object] = {"n": n, "limits": limits, "share_pct": shares,
                                      "products_per_s": [round(r, 1) for r in rates]}
            print(f"tenants: {name}: limits {limits} got {shares} %", file=sys.stderr)
            if args.paced and not why:
                paced = [round(r / references[n] * 100, 1) for r in run(list(envs), n, folder, limits)]
                row["paced_share_pct"] = paced
                print(f"tenants: {name}: limits {limits} paced got {paced} %", file=sys.stderr)
            report["scenarios"][name] = row  # type: ignore[index]
    report["alone_products_per_s"] = {str(n): round(r, 1) for n, r in references.items()}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
