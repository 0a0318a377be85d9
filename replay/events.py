"""The departures replay: pods arrive and leave at their trace times; what does not fit waits and is retried.

Protocol (ours; no published result exists for it):
1. Pods: the seed's arrivals of the FGD protocol (`replay.arrivals`: the trace's pods and the resamples that
   inflate it to `ratio` of GPU capacity, DEFAULT_RATIO = 2; a resample keeps the times of the pod it copies), in
   creation-time order (ties in the seed's order). The node ranks are the seed's too.
2. Times: a pod arrives at (creation_time - origin) / `time_scale` (DEFAULT_TIME_SCALE = 3000) and stays
   deletion_time - creation_time seconds from the moment it is placed; the origin is the 10th percentile of the
   trace's creation times (the earlier pods, spread over most of the trace's span, arrive at 0). Arrivals are
   compressed because the openb lists are snapshots: at their own times the cluster never holds more than 1 % of
   its GPUs, and even all at once their requests reach only their total (98 % of capacity for default), hence
   the inflation to twice the capacity.
3. At equal times departures come first. An arriving pod goes through kube-scheduler's CPU and memory fit and
   the placement loop (`scheduler.placement`, decide mode) as in `replay.run`; one that fits nowhere waits. After a
   departure the waiting pods are retried in arrival order on the node that was freed (the only node on which a
   waiting pod can newly fit), through the same loop.
4. The run ends at the last arrival (`horizon`); pods still waiting then were never placed.

Reported: the allocated GPU share over time (time-weighted mean over the run and a curve at 100 points), the GPU
share requested by waiting pods, the queueing delay of placed pods (mean, p50, p95, p99, in compressed seconds)
and the pods never placed. Called by `vgpu replay --departures` (replay/cli.py) and bench/.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from vgpu.replay.arrivals import arrival_sequence
from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.run import Candidates, load_trace, new_placement, prepare_policy
from vgpu.replay.trace import TracePod
from vgpu.scheduler.fit import FitResult
from vgpu.scheduler.nodestate import gpu_types
from vgpu.scheduler.placement import REFRESH_BUDGET, PodShape
from vgpu.scheduler.policies.base import NodePolicy

__all__ = ["DEFAULT_TIME_SCALE", "Consolidator", "DeparturesResult", "DeparturesState", "replay_departures",
           "run_departures"]

DEFAULT_TIME_SCALE = 3000.0
DEFAULT_RATIO = 2.0  # the arrivals' GPU request, as a share of capacity (the FGD protocol's 1.3 never saturates)
END_SHARE = 0.25  # `allocated_pct_end` is the mean over this last share of the run
ORIGIN_PERCENTILE = 10  # creation times before this percentile of the trace's arrive at time 0
CURVE_POINTS = 100


@dataclass(slots=True)
class DeparturesResult:
    """One (policy, seed) departures replay."""

    policy: str
    seed: int
    allocated_pct_mean: float
    allocated_pct_end: float
    waiting_pct_mean: float
    never_placed: int
    placed: int
    waited: int
    delay_mean_s: float
    delay_p50_s: float
    delay_p95_s: float
    delay_p99_s: float
    seconds: float
    pods: int = 0
    allocated_curve: list[float] = field(default_factory=list)  # allocated % at CURVE_POINTS even times
    waiting_curve: list[float] = field(default_factory=list)  # GPU % requested by waiting pods, same times

    def summary(self) -> dict[str, object]:
        """The JSON row of `vgpu replay --departures --json`."""
        return {
            "policy": self.policy,
            "seed": self.seed,
            "allocated_pct_mean": round(self.allocated_pct_mean, 4),
            "allocated_pct_end": round(self.allocated_pct_end, 4),
            "waiting_pct_mean": round(self.waiting_pct_mean, 4),
            "never_placed": self.never_placed,
            "placed": self.placed,
            "waited": self.waited,
            "delay_mean_s": round(self.delay_mean_s, 2),
            "delay_p50_s": round(self.delay_p50_s, 2),
            "delay_p95_s": round(self.delay_p95_s, 2),
            "delay_p99_s": round(self.delay_p99_s, 2),
            "seconds": round(self.seconds, 3),
        }


class _Timeline:
    """Piecewise-constant allocated and waiting GPU milli over time, for the means and the curves."""

    def __init__(self) -> None:
        self.times: list[float] = [0.0]
        self.allocated: list[int] = [0]
        self.waiting: list[int] = [0]

    def record(self, now: float, allocated: int, waiting: int) -> None:
        if now == self.times[-1]:
            self.allocated[-1], self.waiting[-1] = allocated, waiting
        else:
            self.times.append(now)
            self.allocated.append(allocated)
            self.waiting.append(waiting)

    def mean(self, values: list[int], horizon: float, start: float = 0.0) -> float:
        """Time-weighted mean of `values` over [start, horizon]."""
        t = np.clip(np.array(self.times + [horizon], dtype=np.float64), start, horizon)
        spans = np.diff(t)
        return float(np.dot(spans, np.array(values, dtype=np.float64)) / (horizon - start)) if horizon > start else 0.0

    def curve(self, values: list[int], horizon: float) -> np.ndarray:
        at = np.linspace(0.0, horizon, CURVE_POINTS)
        index = np.searchsorted(np.array(self.times), at, side="right") - 1
        out: np.ndarray = np.array(values, dtype=np.float64)[index]
        return out


def arrival_times(pods: Sequence[TracePod], sequence: Sequence[int], time_scale: float) -> list[float]:
    """Arrival time of each pod of `sequence`: its creation time after the origin (the 10th percentile of the
    trace's creation times; pods created earlier arrive at 0), divided by `time_scale`."""
    created = np.array([max(p.created, 0) for p in pods], dtype=np.float64)
    origin = float(np.percentile(created, ORIGIN_PERCENTILE)) if len(created) else 0.0
    return [max(created[j] - origin, 0.0) / time_scale for j in sequence]


def replay_departures(
    cluster: ReplayCluster,
    pods: Sequence[TracePod],
    sequence: Sequence[int],
    rank: np.ndarray,
    policy: NodePolicy,
    seed: int = 0,
    time_scale: float = DEFAULT_TIME_SCALE,
    consolidator: Consolidator | None = None,
) -> tuple[np.ndarray, np.ndarray, _Timeline, float]:
    """Replay `sequence` with departures; per arrival its placement time (nan: never placed) and node (-1), the
    allocation timeline and the horizon. A `consolidator` is called before each arrival with the run's state
    (`DeparturesState`), and may move placed pods and place waiting ones (replay.consolidation)."""
    cluster.reset(rank)
    placement = new_placement(cluster, policy, seed, REFRESH_BUDGET)
    shapes: dict[tuple[int, int, int, int, tuple[str, ...]], PodShape] = {}
    arrive = arrival_times(pods, sequence, time_scale)
    events = sorted(range(len(sequence)), key=arrive.__getitem__)  # stable: the seed's order on ties
    horizon = max(arrive) if arrive else 0.0
    placed_at = np.full(len(sequence), np.nan)
    where = np.full(len(sequence), -1, dtype=np.int64)
    leaving: list[tuple[float, int]] = []  # (time, event) of placed pods
    waiting: dict[tuple[int, int, int, int, tuple[str, ...]], list[int]] = {}  # shape -> events, arrival order
    timeline = _Timeline()
    run = DeparturesState(cluster, pods, sequence, placed_at, where, {}, waiting)
    states = cluster.states
    capacity = gpu_types(states)

    def shape_of(e: int) -> tuple[tuple[int, int, int, int, tuple[str, ...]], PodShape]:
        pod = pods[sequence[e]]
        spec = (pod.cpu, pod.memory, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
        shape = shapes.get(spec)
        if shape is None:
            shape = shapes[spec] = placement.shape(pod.requests(), pod.selectors(), pod.context())
        return spec, shape

    def place(e: int, now: float, candidates: np.ndarray) -> bool:
        _, shape = shape_of(e)
        choice = placement.choose(Candidates(states, candidates), shape, explain=False, slots=candidates)
        if choice.best is None or choice.result is None:
            return False
        run.put(e, int(candidates[choice.best_index]), choice.result, now)
        heapq.heappush(leaving, (now + _stay(pods[sequence[e]]), e))
        return True

    run.on_placed = lambda e, now: heapq.heappush(leaving, (now + _stay(pods[sequence[e]]), e))

    def depart(now: float) -> None:
        _, e = heapq.heappop(leaving)
        n = int(where[e])
        run.take(e)
        # a waiting pod can newly fit only here: retry them in arrival order, skipping shapes that no longer fit
        heads = [(events_rank[queue[0]], spec) for spec, queue in waiting.items()]
        heapq.heapify(heads)
        only = np.array([n], dtype=np.int64)
        while heads:
            _, spec = heapq.heappop(heads)
            queue = waiting[spec]
            first = pods[sequence[queue[0]]]
            if cluster.cpu_free[n] < first.cpu or cluster.mem_free[n] < first.memory or not place(queue[0], now, only):
                continue
            run.queued -= first.gpu_total
            queue.pop(0)
            if queue:
                heapq.heappush(heads, (events_rank[queue[0]], spec))
            else:
                del waiting[spec]

    events_rank = run.rank = {e: k for k, e in enumerate(events)}
    for e in events:
        now = arrive[e]
        while leaving and leaving[0][0] <= now:
            then = leaving[0][0]
            depart(then)
            timeline.record(then, run.allocated, run.queued)
        if consolidator is not None and consolidator(run, now):
            timeline.record(now, run.allocated, run.queued)
        pod = pods[sequence[e]]
        spec, shape = shape_of(e)
        policy.observe(shape.requests, shape.context)
        if not place(e, now, cluster.fitting(pod.cpu, pod.memory)):
            waiting.setdefault(spec, []).append(e)
            run.queued += pod.gpu_total
        policy.relearn(capacity)
        timeline.record(now, run.allocated, run.queued)
    return placed_at, where, timeline, horizon


def _stay(pod: TracePod) -> float:
    """How long a placed pod stays: its trace lifetime (forever without a deletion time)."""
    return max(pod.deleted - pod.created, 0) if pod.deleted >= 0 else float("inf")


@dataclass
class DeparturesState:
    """A departures run as a consolidator sees and changes it: the cluster, the placed pods' nodes and grants by
    event, the waiting pods by shape (arrival order), the allocated and waiting GPU milli; `put` and `take` charge
    and release a pod (keeping those in step), `on_placed` schedules a newly placed pod's departure."""

    cluster: ReplayCluster
    pods: Sequence[TracePod]
    sequence: Sequence[int]
    placed_at: np.ndarray
    where: np.ndarray
    results: dict[int, FitResult]
    waiting: dict[tuple[int, int, int, int, tuple[str, ...]], list[int]]
    allocated: int = 0
    queued: int = 0
    rank: dict[int, int] = field(default_factory=dict)  # event -> its position in arrival order
    on_placed: Callable[[int, float], None] = lambda e, now: None

    def put(self, e: int, n: int, result: FitResult, now: float | None = None) -> None:
        """Charge event e's pod on node n with these grants; `now` given: it is newly placed (else moved)."""
        pod = self.pods[self.sequence[e]]
        self.cluster.place(n, pod.cpu, pod.memory, result)
        self.results[e], self.where[e] = result, n
        if now is not None:
            self.placed_at[e] = now
            self.allocated += pod.gpu_total

    def take(self, e: int, moved: bool = False) -> None:
        """Release event e's pod from its node (`moved`: it is put elsewhere at once)."""
        pod = self.pods[self.sequence[e]]
        self.cluster.remove(int(self.where[e]), pod.cpu, pod.memory, self.results.pop(e))
        if not moved:
            self.allocated -= pod.gpu_total


# called before each arrival with the run's state and the time; True when it changed what is placed or waiting
Consolidator = Callable[[DeparturesState, float], bool]


def run_departures(nodes: str, pods: str, policy_name: str, seed: int, ratio: float = DEFAULT_RATIO,
                   variant: str = "", time_scale: float = DEFAULT_TIME_SCALE) -> DeparturesResult:
    """One (trace, policy, seed) departures replay."""
    trace, cluster = load_trace(nodes, pods, variant)
    sequence, rank = arrival_sequence(trace.pods, cluster.capacity_milli, len(trace.nodes), seed, ratio)
    policy = prepare_policy(policy_name, trace.pods, seed)
    start = time.process_time()
    placed_at, _, timeline, horizon = replay_departures(cluster, trace.pods, sequence, rank, policy, seed, time_scale)
    seconds = time.process_time() - start
    arrive = np.array(arrival_times(trace.pods, sequence, time_scale))
    done = ~np.isnan(placed_at)
    delay = placed_at[done] - arrive[done]
    scale = 100.0 / cluster.capacity_milli

    def pct(q: float) -> float:
        return float(np.percentile(delay, q)) if len(delay) else 0.0

    return DeparturesResult(
        policy=policy_name,
        seed=seed,
        allocated_pct_mean=scale * timeline.mean(timeline.allocated, horizon),
        allocated_pct_end=scale * timeline.mean(timeline.allocated, horizon, (1 - END_SHARE) * horizon),
        waiting_pct_mean=scale * timeline.mean(timeline.waiting, horizon),
        never_placed=int((~done).sum()),
        placed=int(done.sum()),
        waited=int((delay > 0).sum()),
        delay_mean_s=float(delay.mean()) if len(delay) else 0.0,
        delay_p50_s=pct(50),
        delay_p95_s=pct(95),
        delay_p99_s=pct(99),
        seconds=seconds,
        pods=len(sequence),
        allocated_curve=[float(x) for x in scale * timeline.curve(timeline.allocated, horizon)],
        waiting_curve=[float(x) for x in scale * timeline.curve(timeline.waiting, horizon)],
    )
