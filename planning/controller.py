"""`vgpu consolidate --watch`: consolidation as a controller, for pods left pending by fragmentation alone.

Every `interval` seconds (while it leads, with leader election on): the cluster is read, and the pending vGPU pods
created at least `pending_for` seconds ago that fit nowhere are the targets. The planner (vgpu.planning.consolidate)
makes room for them, within the move budget; a target it finds moves for waits on fragmentation alone (moving
shares suffices), one it finds none for stays (the cluster is full, or the budgets, priorities and opt-outs forbid
it). The plan is carried out as `--execute` does (vgpu.planning.execute: holds, evictions, checks, stop on the first
surprise).

The budget: at most `share_per_hour` of the running vGPU pods moved per hour (a token bucket counting the running
pods at each look, saving up at most one hour's moves), and at least one move an hour.

Metrics (`SPECS`, on its own listener): moves planned, moves done, GPUs whose room was given to its pod, runs
stopped on a surprise, and the pods waiting for room at the last look.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from vgpu.metricspec import MetricSpec
from vgpu.planning.consolidate import ConsolidationPlan, plan_consolidation
from vgpu.planning.execute import ExecutionReport, execute_plan
from vgpu.planning.snapshot import ClusterSnapshot

__all__ = ["SPECS", "ConsolidationController", "controller_for"]

log = logging.getLogger(__name__)

HOUR = 3600.0
SPECS = (
    MetricSpec("vgpu_consolidation_moves_planned", "counter", (), "pods the consolidation controller planned to move"),
    MetricSpec("vgpu_consolidation_moves", "counter", (), "pods it evicted whose replacement was placed"),
    MetricSpec("vgpu_consolidation_gpus_freed", "counter", (),
               "GPUs whose room it made and gave to the pod it was made for"),
    MetricSpec("vgpu_consolidation_stops", "counter", (), "runs it stopped on a surprise"),
    MetricSpec("vgpu_consolidation_waiting_pods", "gauge", (),
               "pending vGPU pods past the wait threshold that fit nowhere, at its last look"),
)


class ConsolidationController:
    """The loop of `vgpu consolidate --watch` (module docstring). `read()` snapshots the cluster and `execute(plan)`
    carries a plan out (the CLI passes the API's; tests may pass their own clocks)."""

    def __init__(self, read: Callable[[], ClusterSnapshot], execute: Callable[[ConsolidationPlan], ExecutionReport],
                 *, policy: str = "fragaware", gpu_policy: str = "binpack", pending_for: float = 300.0,
                 share_per_hour: float = 0.05, min_age: float = 0.0, max_moves: int = 20,
                 registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time) -> None:
        self.read, self.execute = read, execute
        self.policy, self.gpu_policy = policy, gpu_policy
        self.pending_for, self.share_per_hour, self.min_age = pending_for, share_per_hour, min_age
        self.max_moves = max_moves  # moves of one look at most, whatever the budget holds
        self.clock = clock
        self.registry = registry or CollectorRegistry()
        planned, moves, freed, stops, waiting = SPECS
        self.planned = planned.counter(self.registry)
        self.moves = moves.counter(self.registry)
        self.freed = freed.counter(self.registry)
        self.stops = stops.counter(self.registry)
        self.waiting = waiting.gauge(self.registry)
        self.tokens = 0.0
        self.last: float | None = None

    def _budget(self, now: float, running: int) -> int:
        allowance = max(1.0, self.share_per_hour * running)
        since = HOUR if self.last is None else now - self.last
        self.tokens = min(allowance, self.tokens + allowance * since / HOUR)
        self.last = now
        return int(self.tokens)

    def look(self) -> ExecutionReport | None:
        """One look: plan for the pods waiting past the threshold and carry the plan out; None when nothing was
        done."""
        now = self.clock()
        snapshot = self.read()
        due = {p.uid for p in snapshot.pending if now - p.created >= self.pending_for}
        budget = self._budget(now, len(snapshot.running))
        if not due:
            self.waiting.set(0)
            return None
        plan = plan_consolidation(snapshot, self.policy, now=now, min_age=self.min_age,
                                  max_moves=max(min(budget, self.max_moves), 0), gpu_policy=self.gpu_policy,
                                  targets=due)
        self.waiting.set(len(plan.steps) + len(plan.unmet))
        for target, why in plan.unmet:
            log.info("event=consolidation_no_plan pod=%s why=%r", target, why)
        if not plan.steps:
            return None
        self.planned.inc(plan.moves)
        report = self.execute(plan)
        self.tokens -= report.evicted
        self.moves.inc(report.moves_done)
        self.freed.inc(sum(len(step.gpus) for step in plan.steps[:report.steps_done]))
        if report.stopped:
            self.stops.inc()
            log.warning("event=consolidation_stopped why=%r", report.stopped)
        return report

    def run(self, interval: float, stop: threading.Event, leading: Callable[[], bool] = lambda: True) -> None:
        """Look every `interval` seconds while `leading()` until `stop` is set; a failed look is logged and the
        next one comes as usual."""
        while not stop.wait(interval):
            if not leading():
                continue
            try:
                self.look()
            except Exception:  # an API outage or a bug in one look must not end the controller
                log.exception("event=consolidation_look_failed")


def controller_for(api: Any, config: Any, args: Any, registry: CollectorRegistry) -> ConsolidationController:
    """The controller of `vgpu consolidate --watch` on a kube client and the extender's configuration."""
    from vgpu.planning.snapshot import read_cluster

    def read() -> ClusterSnapshot:
        return read_cluster(api, config.sharing, frozenset(config.scheduler_names))

    def execute(plan: ConsolidationPlan) -> ExecutionReport:
        return execute_plan(api, plan, timeout=args.timeout, hold_seconds=min(args.hold_seconds, HOUR),
                            say=lambda line: log.info("event=consolidation %s", line))

    return ConsolidationController(read, execute, policy=config.node_policy, gpu_policy=config.gpu_policy,
                                   pending_for=args.pending_for, share_per_hour=args.move_share,
                                   min_age=args.min_age, max_moves=args.max_moves, registry=registry)

