"""Publishes this node's GPU inventory as `volcano.sh/node-vgpu-register` (and optionally the handshake), and each
GPU's NVLink island and NUMA node as `vgpu-sharing.io/node-gpu-topology` (`topology_value`).

One thread started by vgpu.deviceplugin.cli: it re-checks every `interval` seconds and at once when `wake()` is called
(health change), patches the node only when the encoded value differs from what the node carries, and writes
`volcano.sh/node-vgpu-handshake: Reported <time>` each round when enabled (Volcano <= 1.15.0). With node labels on
(the default) the same patch keeps `nvidia.com/gpu.product`, `nvidia.com/gpu.memory` (MiB), `nvidia.com/gpu.count`
and `volcano.sh/vgpu.mode` equal to this node's GPUs, in the forms of NVIDIA's GPU Feature Discovery (product
with spaces as dashes; the first GPU's model and memory on a node with mixed cards). It also runs the allocator's
cache-directory garbage collection about once a minute.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client as k8s

from vgpu import keys
from vgpu.deviceplugin.server import DeviceState
from vgpu.inventory import GPUDevice, encode_topology, encode_volcano
from vgpu.kube.client import read_json
from vgpu.kube.patch import patch_node_metadata
from vgpu.units import MemoryUnit

__all__ = ["LABEL_COUNT", "LABEL_MEMORY", "LABEL_MODE", "LABEL_PRODUCT", "Registrar", "inventory_value",
           "node_labels", "topology_value"]

LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_MODE = "volcano.sh/vgpu.mode"

log = logging.getLogger(__name__)


def inventory_value(state: DeviceState, split: int, factor: int, mode: str) -> str:
    """The annotation value for the current GPUs and health (sorted by minor number)."""
    _, gpus, health = state.snapshot()
    devices = [
        GPUDevice(
            uuid=g.uuid,
            split=split,
            memory=MemoryUnit(factor).units(g.memory_mib),
            type=f"NVIDIA-{g.name}",
            healthy=health.get(g.uuid, False),
            mode=mode,
            index=i,
            numa=g.numa or 0,
        )
        for i, g in enumerate(sorted(gpus, key=lambda g: g.minor))
    ]
    return encode_volcano(devices)


def topology_value(state: DeviceState) -> str:
    """The topology annotation value for the current GPUs (sorted by minor number)."""
    _, gpus, _ = state.snapshot()
    return encode_topology([(g.uuid, g.nvlink_island, g.numa) for g in sorted(gpus, key=lambda g: g.minor)])


def _label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip())[:63]
    return value.strip("-_.")


def node_labels(state: DeviceState, mode: str) -> dict[str, str]:
    """The GPU labels of this node (empty without GPUs)."""
    _, gpus, _ = state.snapshot()
    if not gpus:
        return {}
    first = min(gpus, key=lambda g: g.minor)
    return {
        LABEL_PRODUCT: _label_value(first.name),
        LABEL_MEMORY: str(first.memory_mib),
        LABEL_COUNT: str(len(gpus)),
        LABEL_MODE: _label_value(mode),
    }


class Registrar:
    """Keeps the node annotation equal to the inventory."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        node_name: str,
        state: DeviceState,
        *,
        split: int,
        factor: int,
        mode: str = keys.MODE_HAMI_CORE,
        interval: float = 30.0,
        handshake: bool = False,
        housekeeping: Callable[[], object] | None = None,
        housekeeping_every: float = 60.0,
        labels: bool = False,
    ) -> None:
        self.labels = labels
        self.api = api_client
        self.node_name = node_name
        self.state = state
        self.split, self.factor, self.mode = split, factor, mode
        self.interval = interval
        self.handshake = handshake
        self.housekeeping = housekeeping
        self.housekeeping_every = housekeeping_every
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.patches = 0

    def wake(self) -> None:
        """Re-check now (called on health changes)."""
        self._wake.set()

    def sync(self) -> bool:
        """One round: read the node, patch if the value differs; True if a patch was sent."""
        desired = inventory_value(self.state, self.split, self.factor, self.mode)
        node = read_json(k8s.CoreV1Api(self.api).read_node(self.node_name, _preload_content=False,
                                                           _request_timeout=10))
        current = ((node.get("metadata") or {}).get("annotations") or {})
        patch: dict[str, str | None] = {}
        if current.get(keys.NODE_REGISTER) != desired:
            patch[keys.NODE_REGISTER] = desired
        topology = topology_value(self.state)
        if current.get(keys.NODE_TOPOLOGY) != topology:
            patch[keys.NODE_TOPOLOGY] = topology
        if self.handshake:
            stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f +0000 UTC")
            patch[keys.NODE_HANDSHAKE] = f"Reported {stamp}"
        label_patch: dict[str, str | None] = {}
        if self.labels:
            have = (node.get("metadata") or {}).get("labels") or {}
            label_patch = {k: v for k, v in node_labels(self.state, self.mode).items() if have.get(k) != v}
        if not patch and not label_patch:
            return False
        patch_node_metadata(self.api, self.node_name, annotations=patch or None, labels=label_patch or None)
        self.patches += 1
        log.info("event=node_annotated node=%s keys=%s", self.node_name, ",".join(sorted([*patch, *label_patch])))
        return True

    def _run(self) -> None:
        last_housekeeping = time.monotonic()
        while not self._stop.is_set():
            delay = self.interval
            try:
                self.sync()
            except Exception as exc:
                log.warning("event=node_annotate_failed node=%s error=%s", self.node_name, exc)
                delay = min(self.interval, 5.0)
            if self.housekeeping and time.monotonic() - last_housekeeping >= self.housekeeping_every:
                last_housekeeping = time.monotonic()
                try:
                    self.housekeeping()
                except Exception as exc:
                    log.warning("event=housekeeping_failed error=%s", exc)
            self._wake.wait(delay)
            self._wake.clear()

    def start(self) -> Registrar:
        """Start the loop thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="registrar", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
