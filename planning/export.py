"""`vgpu whatif --export DIR`: the cluster as a trace the replay reads (`vgpu replay --nodes --pods`).

`nodes.csv` has the openb node list's columns (sn, cpu_milli, memory_mib, gpu, model) and `pods.csv` the openb pod
list's (name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase, creation_time, deletion_time,
scheduled_time), one row per vGPU pod, running or pending. A pod's `gpu_milli` is its share of each of its GPUs
(scheduler.policies.shares.request_milli: the larger of its memory and cores fractions) on the card it runs on, or
for a pending pod on the cluster's most common card; `num_gpu` counts the GPUs of all its containers, and a pod
whose containers ask different shares is written with the largest. Times are seconds from the oldest pod's
creation. `model` is the GPU's product name (the inventory's type without its vendor prefix). With `anonymise`,
node and pod names become salted hashes (the salt is not kept: names from two exports do not match).
"""

from __future__ import annotations

import csv
import hashlib
import os
from collections import Counter
from pathlib import Path

from vgpu.errors import ConfigError
from vgpu.inventory import GPUDevice
from vgpu.planning.snapshot import ClusterSnapshot, SnapshotPod
from vgpu.scheduler.policies.shares import request_milli

__all__ = ["NODE_COLUMNS", "POD_COLUMNS", "export_trace"]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
               "creation_time", "deletion_time", "scheduled_time")
VENDOR_PREFIX = "NVIDIA-"


def _model(device: GPUDevice) -> str:
    return device.type.removeprefix(VENDOR_PREFIX).replace(",", " ")


def _milli(pod: SnapshotPod, card: GPUDevice) -> int:
    return max((request_milli(r, card) for r in pod.requests), default=0)


def export_trace(snapshot: ClusterSnapshot, folder: str | Path, anonymise: bool = False) -> tuple[Path, Path]:
    """Write nodes.csv and pods.csv into `folder` (created if needed); returns their paths."""
    salt = os.urandom(16)

    def name(kind: str, text: str) -> str:
        if not anonymise:
            return text
        return f"{kind}-{hashlib.sha256(salt + text.encode()).hexdigest()[:12]}"

    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--export: cannot create {out}: {exc.strerror}") from None
    nodes = [s for s in snapshot.nodes if not s.error and s.devices]
    cards = {s.name: s.devices[0] for s in nodes}
    common = Counter(d.type for s in nodes for d in s.devices).most_common(1)
    default_card = next((d for s in nodes for d in s.devices if common and d.type == common[0][0]), None)
    pods = [*snapshot.running, *snapshot.pending]
    origin = min((p.created for p in pods if p.created), default=0.0)
    node_path, pod_path = out / "nodes.csv", out / "pods.csv"
    try:
        with node_path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(NODE_COLUMNS)
            for state in nodes:
                writer.writerow((name("node", state.name), state.cpu_allocatable or 0, state.memory_allocatable or 0,
                                 len(state.devices), _model(state.devices[0])))
        with pod_path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(POD_COLUMNS)
            for pod in pods:
                card = cards.get(pod.node) or default_card
                milli = _milli(pod, card) if card is not None else 0
                created = max(0, round(pod.created - origin)) if pod.created else 0
                scheduled = max(0, round(pod.started - origin)) if pod.node and pod.started else ""
                writer.writerow((name("pod", pod.ref), pod.cpu, pod.memory, pod.gpus, milli,
                                 "|".join(pod.selectors.use_types), "", "Running" if pod.node else "Pending",
                                 created, "", scheduled))
    except OSError as exc:
        raise ConfigError(f"--export: cannot write into {out}: {exc.strerror}") from None
    return node_path, pod_path
