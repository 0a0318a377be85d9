"""The departures replay with consolidation: whole-GPU pods that wait get room made by moving shares, as
`vgpu consolidate` would make it, within a budget of moves.

Every `period` replay seconds in which a pod asking whole GPUs (gpu_milli 1000) waits, the run's state is taken as
a snapshot (vgpu.planning.snapshot: every placed pod with its grants, CPU-only ones included for their CPU, and as
pending the `TARGETS` whole-GPU pods that have waited longest, at most one per move the budget allows) and the
consolidation planner (vgpu.planning.consolidate, under the run's policy) plans moves for them; the plan is then
carried out on the run exactly: the moved pods' grants taken off, the room given to the pod it was made for
(placed now), the moved pods put where the plan put them. Every placed pod is movable once it has run `min_age`
replay seconds (the trace's pods all belong to controllers). A moved pod keeps its departure time (the trace's
lifetimes are those of services, which a move does not lengthen).

The budget: at most `share_per_hour` of the running pods moved per replay hour (a token bucket refilled with the
running pods counted at each look, saving up at most one hour's moves). `share_per_hour` 0 is the replay without
consolidation. Reported beside the departures figures: the moves made, and the whole-GPU pods' queueing delay
(mean, p50, p95), how many waited, and those never placed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from vgpu.planning.consolidate import plan_consolidation
from vgpu.planning.snapshot import ClusterSnapshot, SnapshotPod
from vgpu.replay.arrivals import arrival_sequence
from vgpu.replay.events import DEFAULT_RATIO, DEFAULT_TIME_SCALE, DeparturesState, arrival_times, replay_departures
from vgpu.replay.run import load_trace, prepare_policy
from vgpu.replay.trace import TracePod
from vgpu.resources import SharingConfig
from vgpu.scheduler.fit import FitResult
from vgpu.scheduler.nodestate import flat_grants

__all__ = ["Consolidation", "ConsolidationResult", "run_consolidation", "whole_gpus"]

HOUR = 3600.0
TARGETS = 4  # waiting pods planned for at one look at most (the longest waiting first)
CONTROLLER = ("ReplicaSet", "trace")


def whole_gpus(pod: TracePod) -> bool:
    """Whether the pod asks whole GPUs."""
    return pod.num_gpu >= 1 and pod.gpu_milli >= 1000


@dataclass
class ConsolidationResult:
    """One (policy, seed, budget) replay with consolidation."""

    policy: str
    seed: int
    share_per_hour: float
    moves: int
    plans: int  # looks that planned
    placed_by_moves: int  # pods given room by a plan
    never_placed: int
    whole_pods: int
    whole_never_placed: int
    whole_waited: int  # whole-GPU pods placed after waiting
    whole_delay_mean_s: float
    whole_delay_p50_s: float
    whole_delay_p95_s: float
    delay_p95_s: float
    allocated_pct_mean: float
    seconds: float

    def summary(self) -> dict[str, object]:
        """The JSON row of bench/consolidation_replay.py."""
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in vars(self).items()}


class Consolidation:
    """The consolidator of `replay.events.replay_departures` (module docstring)."""

    def __init__(self, policy: str, share_per_hour: float, period: float = 5.0, min_age: float = 60.0) -> None:
        self.policy = policy
        self.share_per_hour = share_per_hour
        self.period = period
        self.min_age = min_age
        self.tokens = 0.0
        self.last = 0.0
        self.next_look = 0.0
        self.moves = self.plans = self.placed = 0

    def __call__(self, run: DeparturesState, now: float) -> bool:
        if self.share_per_hour <= 0 or now < self.next_look:
            return False
        self.next_look = now + self.period
        running = len(run.results)
        allowance = self.share_per_hour * running
        self.tokens = min(allowance, self.tokens + allowance * (now - self.last) / HOUR)
        self.last = now
        budget = int(self.tokens)
        if budget < 1:
            return False
        targets = sorted((e for queue in run.waiting.values() for e in queue
                          if whole_gpus(run.pods[run.sequence[e]])), key=run.rank.__getitem__)[:min(budget,
                                                                                                    TARGETS)]
        if not targets:
            return False
        names = [state.name for state in run.cluster.states]
        placed = [_pod(run, e, names[int(run.where[e])], float(run.placed_at[e])) for e in run.results]
        snapshot = ClusterSnapshot(SharingConfig(), run.cluster.states, placed,
                                   [_pod(run, e, "", float("nan")) for e in targets], {}, {})
        plan = plan_consolidation(snapshot, self.policy, now=now, min_age=self.min_age, max_moves=budget)
        self.plans += 1
        if not plan.steps:
            return False
        index = {name: n for n, name in enumerate(names)}
        for step in plan.steps:
            moved = [int(m.pod.uid) for m in step.moves]
            for e in moved:
                run.take(e, moved=True)
            assert step.beneficiary is not None
            e = int(step.beneficiary.uid)
            pod = run.pods[run.sequence[e]]
            run.put(e, index[step.node], FitResult(True, assignment=step.hold), now)
            run.on_placed(e, now)
            run.queued -= pod.gpu_total
            for queue in run.waiting.values():
                if e in queue:
                    queue.remove(e)
                    break
            for move in step.moves:
                run.put(int(move.pod.uid), index[move.target], FitResult(True, assignment=move.assignment))
        for spec in [spec for spec, queue in run.waiting.items() if not queue]:
            del run.waiting[spec]
        self.moves += plan.moves
        self.tokens -= plan.moves
        self.placed += len(plan.steps)
        return True


def _pod(run: DeparturesState, e: int, node: str, started: float) -> SnapshotPod:
    """Event e's pod as the planner sees it: its UID is the event's number."""
    pod = run.pods[run.sequence[e]]
    result = run.results.get(e)
    context = pod.context()
    return SnapshotPod(uid=str(e), namespace="trace", name=pod.name, node=node, requests=pod.requests(),
                       selectors=context.selectors, cpu=pod.cpu, memory=pod.memory, priority=0, created=float(e),
                       started=started, controller=CONTROLLER, labels={}, opted_out=False,
                       grants=flat_grants(result.assignment) if result is not None else (),
                       assignment=result.assignment if result is not None else ())


def run_consolidation(nodes: str, pods: str, policy_name: str, seed: int, share_per_hour: float,
                      ratio: float = DEFAULT_RATIO, time_scale: float = DEFAULT_TIME_SCALE,
                      period: float = 5.0, min_age: float = 60.0) -> ConsolidationResult:
    """One departures replay of (trace, policy, seed) with consolidation at this budget (0: none)."""
    trace, cluster = load_trace(nodes, pods)
    sequence, rank = arrival_sequence(trace.pods, cluster.capacity_milli, len(trace.nodes), seed, ratio)
    policy = prepare_policy(policy_name, trace.pods, seed)
    consolidation = Consolidation(policy_name, share_per_hour, period, min_age)
    start = time.process_time()
    placed_at, _, timeline, horizon = replay_departures(cluster, trace.pods, sequence, rank, policy, seed, time_scale,
                                                        consolidation)
    seconds = time.process_time() - start
    arrive = np.array(arrival_times(trace.pods, sequence, time_scale))
    whole = np.array([whole_gpus(trace.pods[j]) for j in sequence], dtype=bool)
    done = ~np.isnan(placed_at)
    delay = placed_at - arrive

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if len(values) else 0.0

    return ConsolidationResult(
        policy=policy_name, seed=seed, share_per_hour=share_per_hour, moves=consolidation.moves,
        plans=consolidation.plans, placed_by_moves=consolidation.placed, never_placed=int((~done).sum()),
        whole_pods=int(whole.sum()), whole_never_placed=int((whole & ~done).sum()),
        whole_waited=int((delay[whole & done] > 0).sum()),
        whole_delay_mean_s=float(delay[whole & done].mean()) if (whole & done).any() else 0.0,
        whole_delay_p50_s=pct(delay[whole & done], 50), whole_delay_p95_s=pct(delay[whole & done], 95),
        delay_p95_s=pct(delay[done], 95),
        allocated_pct_mean=100.0 / cluster.capacity_milli * timeline.mean(timeline.allocated, horizon),
        seconds=seconds)
