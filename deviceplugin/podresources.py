"""kubelet's pod-resources API (v1 `List`), read by the allocator to learn which pod kubelet is admitting.

kubelet adds a pod to its pod manager before admitting it and records a container's devices of one resource as
soon as that resource's Allocate returns, so while it admits a container `List` shows the pod, and the container
holds the devices of the calls already answered and none of the resource being asked for. Pods that are bound but
not yet picked up by kubelet are not listed. The allocator reads this view before it fixes a match: it names
the pod being admitted among those the calls fit, and a view naming none of them says the pod cache lags.
Without the socket it answers None and the allocator keeps to its calls-only rules.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from vgpu.proto.podresources.v1 import api_pb2 as pb
from vgpu.proto.podresources.v1 import api_pb2_grpc as pb_grpc

__all__ = ["Assigned", "KubeletPods", "default_socket"]

log = logging.getLogger(__name__)

# (namespace, name) -> container -> resource -> device IDs
Assigned = dict[tuple[str, str], dict[str, dict[str, frozenset[str]]]]


def default_socket(kubelet_dir: str) -> str:
    """kubelet's pod-resources socket next to its device-plugin directory (`/var/lib/kubelet/pod-resources/...`)."""
    return str(Path(kubelet_dir).parent / "pod-resources" / "kubelet.sock")


class KubeletPods:
    """A client of kubelet's PodResourcesLister; thread-safe."""

    def __init__(self, socket_path: str, timeout: float = 2.0) -> None:
        self.path = Path(socket_path)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._warned = False

    def _stub(self) -> pb_grpc.PodResourcesListerStub:
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(f"unix://{self.path}")
            return pb_grpc.PodResourcesListerStub(self._channel)

    def assigned(self) -> Assigned | None:
        """Devices per pod and container as kubelet lists them now; None when kubelet cannot be asked."""
        if not self.path.exists():
            self._warn("socket absent")
            return None
        try:
            answer = self._stub().List(pb.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            self._warn(exc.details() or str(exc.code()))
            return None
        self._warned = False
        listed: Assigned = {}
        for pod in answer.pod_resources:
            containers = listed.setdefault((pod.namespace, pod.name), {})
            for container in pod.containers:
                held = containers.setdefault(container.name, {})
                for devices in container.devices:
                    held[devices.resource_name] = held.get(devices.resource_name, frozenset()) | frozenset(
                        devices.device_ids)
        return listed

    def _warn(self, why: str) -> None:
        if not self._warned:
            log.warning("event=pod_resources_unavailable socket=%s error=%s: waiting pods that Allocate calls "
                        "cannot tell apart are refused", self.path, why)
            self._warned = True

    def close(self) -> None:
        """Close the channel."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
