"""One replay run: a trace's pods placed one after another through the extender's own placement loop.

Each pod in the seed's arrival sequence (`replay.arrivals`) first goes through kube-scheduler's CPU and memory fit
(vectorised), then through `scheduler.placement.Placement` in decide mode over the nodes that pass, exactly as
`vgpu scheduler --mode decide` chooses: the same memo, the same stale-score budget for a learning policy, the same
node comparison (ties go to the node's seed rank). The chosen node is charged; a pod that fits nowhere fails and is
not retried. Results are the unallocated GPU share when arrivals reach 100 % and 130 % of capacity.

`mode` says who picks the GPUs inside the chosen node (`MODES`): `deviceplugin`, our fit with the policy's GPU
order (the extender's grant is what the device plugin serves); `dra`, kube-scheduler's structured-parameters
allocator (first fit in slice order, `lowest_index_order`), with our policy scoring each node on the devices the
allocator will take there (what the extender does in DRA mode, docs/dra.md); `dra-naive`, the node our policy picks
in device-plugin mode, and then the allocator's first fit on it (a node policy that ignores who picks the device).

A policy name with the suffix `@flat` (`fragaware@flat`) runs with placement's topology awareness off
(`Placement(topology=False)`); it matters only on a cluster whose nodes publish NVLink islands (the `nvlink`
variants), where a run also reports the share of placed multi-GPU pods that got GPUs of one island.

Two things differ from a live cluster, on purpose: CPU-only pods are placed by the policy too, as the FGD protocol
does (in a cluster kube-scheduler places them without the extender), and pods never leave.
Called by `vgpu replay` (replay/cli.py) and bench/.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, overload

import numpy as np

from vgpu.replay.arrivals import arrival_sequence
from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.trace import Trace, TracePod
from vgpu.replay.variants import derive
from vgpu.scheduler.fit import fit, topology_known, topology_tier
from vgpu.scheduler.nodestate import NodeState, gpu_types
from vgpu.scheduler.placement import REFRESH_BUDGET, Choice, Placement, PodShape
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.policies.base import NodePolicy
from vgpu.scheduler.policies.shares import lowest_index_order

__all__ = ["FLAT", "MODES", "WORK", "Candidates", "RunResult", "curve", "load_trace", "new_placement",
           "prepare_policy", "replay", "run_many", "run_one"]

MODES = ("deviceplugin", "dra", "dra-naive")
FLAT = "@flat"  # the suffix of a policy name that turns placement's topology awareness off
WORK = ("evaluated", "evaluations", "scorings")  # `Placement`'s counts of its work that `replay` reports


@dataclass(slots=True)
class RunResult:
    """One (policy, seed) replay."""

    policy: str
    seed: int
    unallocated_pct_at_100: float
    unallocated_pct_at_130: float
    failed_pods: int
    seconds: float
    pods: int = 0
    curve: list[float] = field(default_factory=list)  # unallocated % at arrived 0..130
    mode: str = "deviceplugin"
    island_pods: int = 0  # placed pods of 2 or more GPUs that one NVLink island of the cluster can hold
    island_local: int = 0  # those of them placed on GPUs of one island

    def summary(self) -> dict[str, object]:
        """The JSON row of `vgpu replay --json` (`mode` only when it is not device-plugin mode)."""
        row: dict[str, object] = {"mode": self.mode} if self.mode != "deviceplugin" else {}
        if self.island_pods:
            row |= {"island_pods": self.island_pods, "island_local": self.island_local}
        return row | {
            "policy": self.policy,
            "seed": self.seed,
            "unallocated_pct_at_100": round(self.unallocated_pct_at_100, 4),
            "unallocated_pct_at_130": round(self.unallocated_pct_at_130, 4),
            "failed_pods": self.failed_pods,
            "seconds": round(self.seconds, 3),
        }



def curve(arrived: np.ndarray, allocated: np.ndarray, capacity_milli: int, top: int = 130) -> np.ndarray:
    """Unallocated % at arrived = 0..top % (mean over events rounding to it, else over the +-1 window)."""
    arrived_pct = np.round(100.0 * arrived / capacity_milli).astype(np.int64)
    alloc_pct = 100.0 * allocated / capacity_milli
    out = np.full(top + 1, np.nan)
    sums = np.bincount(np.clip(arrived_pct, 0, top + 2), weights=alloc_pct, minlength=top + 3)
    counts = np.bincount(np.clip(arrived_pct, 0, top + 2), minlength=top + 3)
    for r in range(top + 1):
        if counts[r]:
            out[r] = sums[r] / counts[r]
        else:
            lo, hi = max(r - 1, 0), r + 2
            if counts[lo:hi].sum():
                out[r] = sums[lo:hi].sum() / counts[lo:hi].sum()
    if counts[0] == 0 and np.isnan(out[0]):
        out[0] = 0.0
    return 100.0 - out



class Candidates(Sequence[NodeState]):
    """The nodes at `indices`, as the sequence of candidates placement reads (without building the list)."""

    def __init__(self, states: list[NodeState], indices: np.ndarray) -> None:
        self.states, self.indices = states, indices

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, i: int) -> NodeState: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[NodeState]: ...

    def __getitem__(self, i: int | slice) -> NodeState | Sequence[NodeState]:
        if isinstance(i, slice):
            return [self.states[n] for n in self.indices[i].tolist()]
        return self.states[int(self.indices[i])]


def new_placement(cluster: ReplayCluster, policy: NodePolicy, seed: int, refresh_budget: int,
                  mode: str = "deviceplugin", topology: bool = True) -> Placement:
    """The extender's placement loop in decide mode over the cluster's nodes (slot = node index); in `dra` mode it
    fits and scores with the allocator's first-fit device order; `topology`: Placement's option."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    placement = Placement(policy, decide=True, refresh_budget=refresh_budget, seed=seed,
                          device_order=lowest_index_order if mode == "dra" else None, topology=topology)
    for state in cluster.states:
        placement.register(state)
    return placement


def replay(
    cluster: ReplayCluster,
    pods: Sequence[TracePod],
    sequence: Sequence[int],
    rank: np.ndarray,
    policy: NodePolicy,
    seed: int = 0,
    on_pod: Callable[[int], None] | None = None,
    refresh_budget: int = REFRESH_BUDGET,
    background: int = 0,
    mode: str = "deviceplugin",
    topology: bool = True,
    tiers: dict[int, int] | None = None,
    work: dict[str, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Place `sequence` one pod at a time; per event the arrived and allocated milli-GPU and the node (-1: failed).
    `mode` (`MODES`, module docstring) says who picks the GPUs inside the chosen node; `topology` is placement's
    option; `tiers`, when given, gets the topology tier (`fit.topology_tier`) of every placed multi-GPU pod by event;
    `work`, when given, gets placement's counts of node states evaluated, fits and scores computed (`WORK`).

    As in the extender, the policy counts each pod before it is placed and relearns after it (`relearn`, off the
    request path: a new target applies from the next pod); `background` stale results are rescored between pods,
    as the extender's learner thread does between requests."""
    cluster.reset(rank)
    placement = new_placement(cluster, policy, seed, refresh_budget, mode, topology)
    shapes: dict[tuple[int, int, int, int, tuple[str, ...]], PodShape] = {}
    n_events = len(sequence)
    arrived_hist = np.zeros(n_events, dtype=np.int64)
    alloc_hist = np.zeros(n_events, dtype=np.int64)
    where = np.full(n_events, -1, dtype=np.int64)
    arrived = allocated = 0
    states = cluster.states
    capacity = gpu_types(states)
    for e, j in enumerate(sequence):
        pod = pods[j]
        spec = (pod.cpu, pod.memory, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
        shape = shapes.get(spec)
        if shape is None:
            shape = shapes[spec] = placement.shape(pod.requests(), pod.selectors(), pod.context())
        arrived += pod.gpu_total
        policy.observe(shape.requests, shape.context)
        candidates = cluster.fitting(pod.cpu, pod.memory)
        choice = placement.choose(Candidates(states, candidates), shape, explain=False, slots=candidates)
        if mode == "dra-naive":
            _first_fit(choice, shape)
        if choice.best is not None and choice.result is not None:
            n = int(candidates[choice.best_index])
            cluster.place(n, pod.cpu, pod.memory, choice.result)
            allocated += pod.gpu_total
            where[e] = n
            if tiers is not None and pod.num_gpu > 1:
                tiers[e] = topology_tier(states[n].devices, choice.result.placement)
        arrived_hist[e] = arrived
        alloc_hist[e] = allocated
        policy.relearn(capacity)
        if background:
            placement.refresh(background)
        if on_pod is not None:
            on_pod(e)
    if work is not None:
        work.update((name, getattr(placement, name)) for name in WORK)
    return arrived_hist, alloc_hist, where


def _first_fit(choice: Choice, shape: PodShape) -> None:
    """Replace the chosen node's GPUs by the allocator's first fit on that node (nothing when nothing was chosen).

    The same GPUs pass the fit in any order, so a pod with one request fits by first fit wherever it fitted."""
    if choice.best is None:
        return
    state = choice.best
    result = fit(state.devices, state.usage, shape.requests, shape.selectors, lowest_index_order)
    choice.result = result if result.ok else None


_TRACES: dict[tuple[str, str, str], tuple[Trace, ReplayCluster]] = {}


def load_trace(nodes: str, pods: str, variant: str = "") -> tuple[Trace, ReplayCluster]:
    """A trace (or its `variant`, replay.variants) and its cluster, loaded once per process."""
    key = (str(nodes), str(pods), variant)
    if key not in _TRACES:
        trace = Trace.load(nodes, pods)
        if variant:
            trace = derive(trace, variant)
        _TRACES[key] = (trace, ReplayCluster(trace.nodes))
    return _TRACES[key]


def prepare_policy(name: str, pods: Sequence[TracePod], seed: int) -> NodePolicy:
    """Build a policy for one run: reseed it and tell it the trace's workload (only an oracle policy listens)."""
    policy = make_policy(name)
    policy.seed(seed)
    policy.set_workload((p.requests(), p.context()) for p in pods)
    return policy


def run_one(nodes: str, pods: str, policy_name: str, seed: int, ratio: float = 1.3, variant: str = "",
            mode: str = "deviceplugin") -> RunResult:
    """Replay one (trace or variant, policy, seed) in `mode` (`MODES`); a policy named with `FLAT` runs without
    topology awareness."""
    trace, cluster = load_trace(nodes, pods, variant)
    sequence, rank = arrival_sequence(trace.pods, cluster.capacity_milli, len(trace.nodes), seed, ratio)
    name = policy_name.removesuffix(FLAT)
    policy = prepare_policy(name, trace.pods, seed)
    tiers: dict[int, int] = {}
    start = time.process_time()
    arrived, allocated, where = replay(cluster, trace.pods, sequence, rank, policy, seed, mode=mode,
                                       topology=name == policy_name, tiers=tiers)
    seconds = time.process_time() - start
    island = _island_size(cluster)
    held = [e for e in tiers if trace.pods[sequence[e]].num_gpu <= island]
    top = round(100 * ratio)
    unalloc = curve(arrived, allocated, cluster.capacity_milli, top=max(top, 130))
    return RunResult(
        policy=policy_name,
        seed=seed,
        unallocated_pct_at_100=float(unalloc[100]),
        unallocated_pct_at_130=float(unalloc[130]),
        failed_pods=int((where < 0).sum()),
        seconds=seconds,
        pods=len(sequence),
        curve=[float(x) for x in unalloc],
        mode=mode,
        island_pods=len(held),
        island_local=sum(tiers[e] == 0 for e in held),
    )


def _island_size(cluster: ReplayCluster) -> int:
    """GPUs of the largest NVLink island of the cluster (0 when no node publishes islands)."""
    sizes = [Counter(d.island for d in devices).most_common(1)[0][1]
             for devices in cluster.devices if devices and topology_known(devices)]
    return max(sizes, default=0)


R = TypeVar("R", bound="Labelled")


class Labelled(Protocol):
    """A run's result: which policy and seed it is of."""

    policy: str
    seed: int


def _run_task(task: tuple[Callable[..., R], tuple[Any, ...]]) -> R:
    runner, args = task
    return runner(*args)


def run_many(
    nodes: str,
    pods: str,
    policies: Sequence[str],
    seeds: Iterable[int],
    jobs: int = 1,
    ratio: float = 1.3,
    on_result: Callable[[R, int, int], None] | None = None,
    variant: str = "",
    runner: Callable[..., R] = run_one,  # type: ignore[assignment]
) -> list[R]:
    """`runner(nodes, pods, policy, seed, ratio, variant)` (`run_one`, or `replay.events.run_departures`) for every
    (policy, seed) pair, in `jobs` processes; `on_result(result, done, total)` after each one."""
    tasks = [(runner, (str(nodes), str(pods), name, seed, ratio, variant)) for seed in seeds for name in policies]
    results: list[R] = []
    if jobs <= 1:
        for task in tasks:
            results.append(_run_task(task))
            if on_result:
                on_result(results[-1], len(results), len(tasks))
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            for result in pool.imap_unordered(_run_task, tasks):
                results.append(result)
                if on_result:
                    on_result(result, len(results), len(tasks))
    order = {(args[2], args[3]): k for k, (_, args) in enumerate(tasks)}
    return sorted(results, key=lambda r: order[(r.policy, r.seed)])
