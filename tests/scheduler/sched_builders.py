"""Builders of API-JSON node and pod dicts for the scheduler tests."""

import itertools

from vgpu import keys
from vgpu.assignment import salvage
from vgpu.dra import DRIVER
from vgpu.inventory import GPUDevice, encode_volcano

_uids = itertools.count(1)


def gpu(uuid, memory=8000, split=10, type_="NVIDIA-NVIDIA A100-PCIE-40GB", healthy=True, mode="hami-core"):
    return GPUDevice(uuid=uuid, split=split, memory=memory, type=type_, healthy=healthy, mode=mode)


def node(name, devices=(), register=None, allocatable=None, labels=None):
    annotations = {}
    if register is None and devices:
        register = encode_volcano(list(devices))
    if register is not None:
        annotations[keys.NODE_REGISTER] = register
    count = sum(d.split for d in devices) if allocatable is None else allocatable
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations, "labels": labels or {}},
        "status": {"allocatable": {"volcano.sh/vgpu-number": str(count), "cpu": "64", "pods": "110"}},
    }


def container(name="main", number=None, memory=None, cores=None, percent=None, extra=None):
    limits = {}
    if number is not None:
        limits["volcano.sh/vgpu-number"] = str(number)
    if memory is not None:
        limits["volcano.sh/vgpu-memory"] = str(memory)
    if cores is not None:
        limits["volcano.sh/vgpu-cores"] = str(cores)
    if percent is not None:
        limits["volcano.sh/vgpu-memory-percentage"] = str(percent)
    limits.update(extra or {})
    return {"name": name, "image": "busybox", "resources": {"limits": limits}}


def pod(name, *containers, namespace="default", annotations=None, uid=None, node_name=None, ids=None,
        phase="Pending", scheduler="vgpu-scheduler"):
    ann = dict(annotations or {})
    if ids is not None:
        ann[keys.VGPU_IDS] = ids
        if node_name:
            ann[keys.VGPU_NODE] = node_name
    if not containers and ids:  # a pod whose spec asks exactly what its assignment grants
        containers = tuple(container(f"c{i}", number=len(seg), memory=max(seg[0].memory, 1), cores=seg[0].cores)
                           for i, seg in enumerate(salvage(ids)) if seg)
    spec = {"schedulerName": scheduler, "containers": list(containers) or [container(number=1)]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{next(_uids)}",
                     "annotations": ann},
        "spec": spec,
        "status": {"phase": phase},
    }


def dra_slice(node_name, devices):
    """A ResourceSlice of our driver for one node."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node_name}-gpus"},
            "spec": {"driver": DRIVER, "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                     "nodeName": node_name, "devices": devices}}


def dra_device(i, **attributes):
    """A shared H100 of a slice, with extra attributes."""
    attrs = {"model": {"string": "NVIDIA H100 80GB HBM3"}, "index": {"int": i}, "uuid": {"string": f"GPU-{i}"},
             **attributes}
    return {"name": f"gpu-{i}", "allowMultipleAllocations": True, "attributes": attrs,
            "capacity": {"memory": {"value": "81559Mi"}, "cores": {"value": "100"}}}
