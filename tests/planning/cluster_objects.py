"""API objects for the planning tests: nodes with the device plugin's inventory, vGPU pods bound with an assignment
or pending, owners, budgets. Plain dicts, as the API server returns them."""
from __future__ import annotations

from typing import Any

from vgpu import keys
from vgpu.assignment import DeviceGrant, encode
from vgpu.inventory import GPUDevice, encode_volcano

CARD_MIB = 40960
CARD = "NVIDIA-NVIDIA A100-PCIE-40GB"


def gpu_uuid(node: str, g: int) -> str:
    return f"GPU-{node}-{g}"


def node(name: str, gpus: int = 4, cpu: str = "64", memory: str = "512Gi", **spec: Any) -> dict[str, Any]:
    devices = [GPUDevice(gpu_uuid(name, g), 10, CARD_MIB, CARD, index=g) for g in range(gpus)]
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                         "annotations": {keys.NODE_REGISTER: encode_volcano(devices)}},
            "spec": dict(spec),
            "status": {"allocatable": {"volcano.sh/vgpu-number": str(gpus * 10), "cpu": cpu, "memory": memory}}}


def pod(name: str, memory: int, cores: int, gpus: int = 1, *, on: str = "", gpu_index: tuple[int, ...] = (),
        namespace: str = "team", owner: tuple[str, str] | None = ("ReplicaSet", "rs"), priority: int | None = None,
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None, cpu: str = "1",
        created: str = "2026-12-01T00:00:00Z", started: str = "2026-12-01T00:00:05Z") -> dict[str, Any]:
    """A vGPU pod asking `gpus` GPUs of `memory` MiB and `cores` % each; bound to `on` with the GPUs `gpu_index`
    when given, else pending."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                            "creationTimestamp": created, "labels": dict(labels or {"app": name}),
                            "annotations": dict(annotations or {})}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": "o-1",
                                    "controller": True}]
    spec: dict[str, Any] = {"schedulerName": "vgpu-scheduler", "containers": [{"name": "main", "resources": {
        "requests": {"cpu": cpu, "memory": "1Gi"},
        "limits": {"volcano.sh/vgpu-number": str(gpus), "volcano.sh/vgpu-memory": str(memory),
                   "volcano.sh/vgpu-cores": str(cores)}}}]}
    if priority is not None:
        spec["priority"] = priority
    status: dict[str, Any] = {"phase": "Pending"}
    if on:
        spec["nodeName"] = on
        meta["annotations"][keys.VGPU_IDS] = encode(
            (tuple(DeviceGrant(gpu_uuid(on, g), memory, cores) for g in gpu_index),))
        status = {"phase": "Running", "startTime": started}
    return {"metadata": meta, "spec": spec, "status": status}


def whole(name: str, gpus: int = 1, **kw: Any) -> dict[str, Any]:
    """A pod asking `gpus` whole GPUs."""
    return pod(name, CARD_MIB, 100, gpus, **kw)


def budget(name: str, match: dict[str, str], allowed: int, namespace: str = "team") -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": match}, "maxUnavailable": allowed},
            "status": {"disruptionsAllowed": allowed}}
