"""The invariants of GPU sharing, checked while a fault test runs, on three independent views of the cluster:

  * the API server: every change of a pod or node (a watch, so every change is seen, not a sample): no GPU's
    memory, compute or share count over-committed by the assignments of the pods bound to its node, no pod holding
    a GPU of another node;
  * what the device plugins handed out: the kubelet stand-ins' trace of admissions (the limits from each
    container's Allocate response, in MiB) and pod ends, read in order: at every admission the limits in force on
    each GPU fit the card;
  * what the isolation library accounts: the accounting file of every container still running, read every 0.25 s
    (files have no change events): no container above its limit, no GPU's summed usage above the card.

`Invariants` runs the three in background threads between `__enter__` and `__exit__`; `violations` lists what
broke, each with the view that saw it.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
from e2e_helpers import check_allocations

from vgpu.inventory import decode_volcano
from vgpu.isolation.region import Region, RegionError
from vgpu.kube import WatchCache, make_api_client

__all__ = ["Invariants"]


class Invariants:
    """The three views of one LocalCluster (see the module docstring)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.violations: list[str] = []
        self.changes = 0  # pod and node changes checked
        self.admissions = 0  # admissions checked against the cards
        self.file_reads = 0  # accounting-file rounds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._api: Any = None
        self._caches: list[WatchCache] = []
        self._live: set[str] = set()  # UIDs of pods admitted and not finished (the trace's view)

    # -- the API server's view
    def _on_change(self, *_objs: Any) -> None:
        nodes = self._caches[1].list() if len(self._caches) > 1 else []
        over, foreign = check_allocations(nodes, self._caches[0].list())
        with self._lock:
            self.changes += 1
            self.violations += [f"annotations: {v}" for v in over + foreign]

    def _watch_api(self) -> None:
        self._api = make_api_client(self.cluster.kubeconfig, qps=1000, burst=1000)
        pods = WatchCache(self._api, "pods", name="invariants-pods", progress_interval=1.0)
        nodes = WatchCache(self._api, "nodes", name="invariants-nodes", progress_interval=1.0)
        self._caches = [pods, nodes]
        for cache in self._caches:
            cache.add_handlers(self._on_change, self._on_change, self._on_change)
            cache.start()

    # -- the device plugins' view
    def _cards(self) -> dict[str, tuple[int, int]]:
        """GPU UUID -> (memory MiB, split) from the nodes' inventories."""
        out = {}
        for node in self.cluster.node_objects():
            value = ((node.get("metadata") or {}).get("annotations") or {}).get("volcano.sh/node-vgpu-register")
            try:
                for dev in decode_volcano(value):
                    out[dev.uuid] = (dev.memory * self.cluster.memory_factor, dev.split)
            except Exception:
                continue
        return out

    def _follow_trace(self) -> None:
        in_force: dict[str, list[tuple[str, int, int]]] = {}  # pod uid -> (gpu, MiB, cores) of its containers
        offset = 0
        cards: dict[str, tuple[int, int]] = {}
        while not self._stop.wait(0.05):
            path: Path = self.cluster.trace
            if not path.exists():
                continue
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            end = data.rfind(b"\n") + 1
            offset += end
            for line in data[:end].splitlines():
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if event.get("ev") == "finished":
                    in_force.pop(event.get("uid", ""), None)
                    self._live.discard(event.get("uid", ""))
                elif event.get("ev") == "admitted" and event.get("limits") is not None:
                    grants = [(gpu, memory, limits.get("cores", 0))
                              for limits in event["limits"].values()
                              for gpu, memory in zip(limits.get("gpus") or (), limits.get("memory_mib") or ())]
                    if not grants:
                        continue
                    in_force[event["uid"]] = grants
                    self._live.add(event["uid"])
                    cards = cards or self._cards()
                    self._check_limits(in_force, cards, event.get("pod", "?"))

    def _check_limits(self, in_force: dict[str, list[tuple[str, int, int]]], cards: dict[str, tuple[int, int]],
                      admitted: str) -> None:
        memory: dict[str, int] = defaultdict(int)
        cores: dict[str, int] = defaultdict(int)
        shares: dict[str, int] = defaultdict(int)
        for grants in in_force.values():
            for gpu, mib, core in grants:
                memory[gpu] += mib
                cores[gpu] += core
                shares[gpu] += 1
        found = []
        for gpu, mib in memory.items():
            card, split = cards.get(gpu, (None, None))
            if card is not None and mib > card:
                found.append(f"limits: {gpu} handed out {mib} of {card} MiB (at {admitted})")
            if cores[gpu] > 100:
                found.append(f"limits: {gpu} handed out {cores[gpu]}% of compute (at {admitted})")
            if split is not None and shares[gpu] > split:
                found.append(f"limits: {gpu} handed to {shares[gpu]} containers, split {split} (at {admitted})")
        with self._lock:
            self.admissions += 1
            self.violations += found

    # -- the isolation library's view
    def _read_files(self) -> None:
        while not self._stop.wait(0.25):
            used: dict[str, int] = defaultdict(int)
            found = []
            for node in self.cluster.nodes:
                root = node.hook_path / "vgpu" / "containers"
                for cache in root.glob("*/*.cache") if root.is_dir() else ():
                    if cache.parent.name.split("_", 1)[0] not in self._live:
                        continue  # a container that ended: its file stays until clean-up
                    try:
                        with Region.open(cache) as region:
                            snap = region.snapshot()
                    except (RegionError, OSError, ValueError):
                        continue
                    for dev in snap.devices:
                        if dev.limit and dev.used > dev.limit:
                            found.append(f"accounting: {cache.parent.name} uses {dev.used} > limit {dev.limit} "
                                         f"on {dev.uuid}")
                        used[dev.uuid] += dev.used
            cards = self._cards()
            for gpu, total in used.items():
                if gpu in cards and total > cards[gpu][0] << 20:
                    found.append(f"accounting: {gpu} carries {total >> 20} MiB of {cards[gpu][0]} MiB")
            with self._lock:
                self.file_reads += 1
                self.violations += found

    def __enter__(self) -> Invariants:
        self._watch_api()
        for target in (self._follow_trace, self._read_files):
            thread = threading.Thread(target=target, daemon=True, name=f"invariants-{target.__name__}")
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: Any) -> None:
        time.sleep(0.3)  # the last changes reach the views
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        for cache in self._caches:
            cache.stop()
        if self._api is not None:
            self._api.close()
