"""GetPreferredAllocation in process: the plugin's services against the API-server stand-in.

The pod source's cache is a snapshot taken before the bind, as a watch cache that lags the API server under load;
`refresh()` lists from the API server, as the plugin's own pod source does.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dp_helpers import NODE, gpu_container

from vgpu.deviceplugin.allocator import Allocator
from vgpu.deviceplugin.matching import GrantRules
from vgpu.deviceplugin.pods import NodePods
from vgpu.deviceplugin.server import MEMORY, NUMBER, DeviceState, ResourceService
from vgpu.node.backends import GPUInfo
from vgpu.node.host import HostFiles
from vgpu.resources import SharingConfig

GPUS = [GPUInfo("GPU-aaaa", "NVIDIA A100-PCIE-40GB", 40960, 0), GPUInfo("GPU-bbbb", "NVIDIA A100-PCIE-40GB", 40960, 1)]


class LaggingPods:
    """A pod source whose cache stays as it was when it was made; `refresh()` reads the API server."""

    def __init__(self, cluster: Any) -> None:
        self.live = NodePods(cluster.api, NODE)
        self.snapshot = self.live.refresh()
        self.refreshes = 0

    def pods(self) -> list[dict[str, Any]]:
        return list(self.snapshot)

    def refresh(self) -> list[dict[str, Any]]:
        self.refreshes += 1
        return self.live.refresh()

    def patch_annotations(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self.live.patch_annotations(namespace, name, annotations)


def service(cluster: Any, kind: str, resource: str, pods: Any) -> ResourceService:
    rules = GrantRules(scheduler_names=frozenset({"vgpu-scheduler"}), card_memory={g.uuid: g.memory_mib for g in GPUS})
    allocator = Allocator(NODE, SharingConfig(), pods, HostFiles(cluster.hook, str(cluster.lock)), rules=rules)
    per_gpu = {NUMBER: lambda g: 10, MEMORY: lambda g: g.memory_mib}[kind]
    return ResourceService(kind, resource, DeviceState(GPUS), per_gpu, allocator)


def prefer(svc: ResourceService, available: Any, size: int, must: list[str] | None = None) -> list[str]:
    request = SimpleNamespace(container_requests=[SimpleNamespace(
        available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size)])
    (answer,) = svc.GetPreferredAllocation(request, None).container_responses
    return list(answer.deviceIDs)


def test_a_pod_the_cache_has_not_seen_is_read_from_the_api_server(cluster):
    pods = LaggingPods(cluster)
    svc = service(cluster, NUMBER, "volcano.sh/vgpu-number", pods)
    cluster.create_pod("late", [gpu_container("c", 1, 1000)], "GPU-bbbb,NVIDIA,1000,0:")
    available = [f"{g.uuid}-{i}" for g in GPUS for i in range(10)]
    assert prefer(svc, available, 1) == ["GPU-bbbb-0"]  # not GPU-aaaa-0, the first GPU in minor order
    assert pods.refreshes == 1
    assert prefer(svc, available, 1) == ["GPU-bbbb-0"]


class CountingIDs:
    """Kubelet's available IDs, counting how many the plugin reads."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.read = 0

    def __iter__(self):
        for device in self.ids:
            self.read += 1
            yield device


def test_a_large_memory_request_reads_only_as_many_ids_as_it_returns(cluster):
    svc = service(cluster, MEMORY, "volcano.sh/vgpu-memory", LaggingPods(cluster))
    ids = [f"{g.uuid}-memory-{i}" for g in GPUS for i in range(g.memory_mib)]
    must = [ids[-1], ids[-2]]
    available = CountingIDs(["GPU-zzzz-memory-0", *ids])  # an ID that is not ours is skipped
    chosen = prefer(svc, available, 30000, must)
    assert len(chosen) == len(set(chosen)) == 30000
    assert chosen[:2] == must and chosen[2:] == [i for i in ids if i not in must][:29998]
    assert available.read <= 30000 + 1
