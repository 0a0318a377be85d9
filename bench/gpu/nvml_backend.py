"""The device plugin's NVML backend on a real GPU: what it discovers, reads and registers.

Run by bench/gpu/h100.sh with `vgpu` importable from a plain checkout (nvidia-ml-py installed). Prints one JSON
document: the GPUs `NVMLBackend` found (as the inventory would publish them), a usage reading, the health events of
a one-second poll (none expected on a healthy GPU), whether the Xid event set was created, and whether the driver
offers per-cgroup memory limits for this process's own cgroup.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path


def own_cgroup() -> str:
    """This process's cgroup directory (cgroup v2), or "" when unknown."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return str(Path("/sys/fs/cgroup") / line[3:].lstrip("/"))
    return ""


def main() -> int:
    from vgpu.node.backends.nvml import NVMLBackend

    backend = NVMLBackend()
    report: dict[str, object] = {"init_error": backend.init_error}
    gpus = backend.devices()
    report["gpus"] = [dataclasses.asdict(g) | {"nvml_index": g.nvml_index} for g in gpus]
    report["usage"] = {uid: dataclasses.asdict(r) for uid, r in backend.usage().items()}
    report["health_events_1s"] = [dataclasses.asdict(e) for e in backend.poll_health(1.0)]
    report["xid_event_set"] = backend.watches_xids
    cgroup = own_cgroup()
    report["cgroup"] = cgroup
    report["memory_limits_supported"] = {g.uuid: backend.memory_limits_supported(g.uuid, cgroup) for g in gpus}
    backend.close()
    json.dump(report, sys.stdout, indent=1, default=str)
    print()
    return 0 if gpus and backend.init_error is None else 1


if __name__ == "__main__":
    sys.exit(main())
