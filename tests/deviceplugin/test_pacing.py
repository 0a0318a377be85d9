"""The pacer's arithmetic (node/pacing.py) and the device plugin's side of it, without a GPU: a pod charged more than
it ran is scaled down until the two agree, one seen over its limit is scaled up whatever its own accounting file
claims, one NVML does not show (or every pod, when NVML cannot be read) goes back to the uncorrected timing, factors
stay within their bounds, and `NodePacer` sums a pod's containers on a GPU, tells processes apart by their cgroup
(a /proc tree written here) and rewrites every container's pace file."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu.isolation.region import RegionDevice, RegionSnapshot
from vgpu.node.pacing import FACTOR_MAX, FACTOR_MIN, NodePacer, Pacer, Tenant
from vgpu.node.records import AllocationRecord

GPU = "GPU-0a7d2c1e-5b9f-4c3d-8e21-6f4a9b0c1d2e"
POD_A = "11111111-2222-3333-4444-555555555555"
POD_B = "66666666-7777-8888-9999-000000000000"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def run(pacer: Pacer, clock: Clock, charged_per_s: float, real: float | None, limit: float = 30,
        periods: int = 1, start: int = 0) -> tuple[float, int]:
    """`periods` one-second periods of one pod charged `charged_per_s` % and running `real` %; its last factor."""
    charged = start
    factor = 1.0
    for _ in range(periods):
        clock.t += 1.0
        charged += int(charged_per_s * 1e7)
        samples = {} if real is None else {42: real}
        factor = pacer.step([Tenant("pod", GPU, limit, charged)], lambda _uuid, seen=samples: seen,
                            lambda pid: "pod" if pid == 42 else None)[("pod", GPU)]
    return factor, charged


def test_a_pod_charged_for_others_slices_is_scaled_down_until_charge_and_time_agree():
    clock = Clock()
    pacer = Pacer(clock)
    charged = run(pacer, clock, 0, 0)[1]   # the first period only sets the baseline
    factor = 1.0
    for _ in range(12):   # the library's events read 1.5x what ran: the charge is 1.5 x real x factor
        factor, charged = run(pacer, clock, 1.5 * 20 * factor, 20, start=charged)
    assert factor == pytest.approx(1 / 1.5, rel=0.01)


def test_a_pod_over_its_limit_is_scaled_up_whatever_its_file_claims():
    clock = Clock()
    pacer = Pacer(clock)
    charged = run(pacer, clock, 0, 0)[1]
    factor, _ = run(pacer, clock, 100, 45, limit=30, start=charged)   # claims 100 % charged, ran 45 % at 30
    assert factor > 1.0


def test_a_pod_nvml_does_not_show_and_an_unreadable_nvml_mean_the_uncorrected_timing():
    clock = Clock()
    pacer = Pacer(clock)
    charged = run(pacer, clock, 0, 0)[1]
    factor, charged = run(pacer, clock, 60, 20, start=charged, periods=3)
    assert factor < 0.8
    assert run(pacer, clock, 60, None, start=charged)[0] == 1.0   # none of its processes in NVML's samples
    clock.t += 1
    step = pacer.step([Tenant("pod", GPU, 30, charged + 10**9)], lambda _uuid: None, lambda _pid: "pod")
    assert step == {("pod", GPU): 1.0}


def test_factors_stay_within_their_bounds():
    clock = Clock()
    low, high, idle = Pacer(clock), Pacer(clock), Pacer(clock)
    charged = run(low, clock, 0, 0)[1]
    assert run(low, clock, 100, 1, start=charged, periods=20)[0] == FACTOR_MIN   # read 100x what ran
    charged = run(high, clock, 0, 0)[1]
    assert run(high, clock, 2, 90, start=charged, periods=20)[0] == FACTOR_MAX   # ran 45x what was read
    charged = run(idle, clock, 0, 0)[1]
    assert run(idle, clock, 0.5, 10, start=charged, periods=5)[0] == 1.0   # read under 1 %: nothing to learn


def test_unlimited_pods_are_not_paced():
    clock = Clock()
    pacer = Pacer(clock)
    for _ in range(3):
        clock.t += 1
        out = pacer.step([Tenant("pod", GPU, 0, 10**9)], lambda _uuid: {42: 50.0}, lambda _pid: "pod")
    assert out == {("pod", GPU): 1.0}


def _record(pod: str, container: str, cores: int) -> AllocationRecord:
    return AllocationRecord(pod_uid=pod, namespace="default", pod=pod[:4], container=container, gpus=(GPU,),
                            memory_bytes=(1 << 30,), cores=cores, cache_file="x.cache")


def _proc(root: Path, pid: int, pod: str | None) -> None:
    (root / str(pid)).mkdir(parents=True)
    path = f"/kubepods/burstable/pod{pod}/cri-containerd-abc.scope" if pod else "/system.slice/sshd.service"
    (root / str(pid) / "cgroup").write_text(f"0::{path}\n")


def test_the_node_pacer_sums_a_pods_containers_and_writes_every_pace_file(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 10, POD_A)
    _proc(proc, 11, POD_A)
    _proc(proc, 20, POD_B)
    _proc(proc, 30, None)   # no pod of ours
    records = [_record(POD_A, "one", 20), _record(POD_A, "two", 20), _record(POD_B, "c", 50)]
    charged = {r.key: 0 for r in records}

    def snapshot(record: AllocationRecord) -> RegionSnapshot:
        device = RegionDevice(index=0, uuid=GPU, limit=0, sm_limit=0, used=0, sm_util=0, charged_ns=charged[record.key])
        return RegionSnapshot(path="", major=1, minor=2, devices=(device,), processes=(), utilization_switch=1,
                              recent_kernel=0, priority=0, last_kernel_time=0, extended=True)

    samples = {10: 15.0, 11: 15.0, 20: 50.0, 30: 99.0}
    clock = Clock()
    pacer = NodePacer(lambda: records, lambda _uuid, seen=samples: seen, snapshot,
                      lambda r: tmp_path / "pace" / r.key / "factors", proc_root=proc)
    pacer._pacer = Pacer(clock)
    pacer.step()
    for _ in range(3):   # pod A (limit 40) charged 60 % for the 30 % its processes ran; pod B charged as it ran
        clock.t += 1
        charged[f"{POD_A}_one"] += 3 * 10**8
        charged[f"{POD_A}_two"] += 3 * 10**8
        charged[f"{POD_B}_c"] += 5 * 10**8
        factors = pacer.step()
    assert factors[(POD_A, GPU)] < 0.7 and factors[(POD_B, GPU)] == pytest.approx(1.0)
    texts = {r.key: (tmp_path / "pace" / r.key / "factors").read_text() for r in records}
    assert texts[f"{POD_A}_one"] == texts[f"{POD_A}_two"] == f"{GPU} {factors[(POD_A, GPU)]:.4f}\n"
    assert texts[f"{POD_B}_c"] == f"{GPU} 1.0000\n"


def _share(pacer: Pacer, clock: Clock, ceiling: float, other: float | None, periods: int,
           state: tuple[float, int] = (1.0, 0)) -> tuple[float, int]:
    """`periods` periods of a pod at limit 30 with `ceiling`, whose timings are exact (charged what it ran, which is
    what its limiter allows under the factor in force, `state[0]` at first) beside another process running `other` %
    (None: NVML unreadable); the factor it was given last and its charge (`state[1]` at first)."""
    factor, charged = state
    for _ in range(periods):
        clock.t += 1.0
        ran = min(30 / factor, 100.0)
        charged += int(ran * factor * 1e7)
        samples = None if other is None else {42: ran, 43: other}
        factor = pacer.step([Tenant("pod", GPU, 30, charged, ceiling_pct=ceiling)], lambda _uuid, seen=samples: seen,
                            lambda pid: "pod" if pid == 42 else None)[("pod", GPU)]
    return factor, charged


def test_a_pod_with_a_ceiling_runs_up_to_it_while_the_gpu_is_otherwise_idle_and_back_when_it_is_not():
    clock = Clock()
    pacer = Pacer(clock)
    state = _share(pacer, clock, 80, 0.0, 8)
    assert state[0] == pytest.approx(30 / 80, rel=0.02)   # its limiter lets it run 80 %: not over the limit in force
    state = _share(pacer, clock, 80, 15.0, 1, state)   # another tenant runs again
    assert state[0] == pytest.approx(1.0, rel=0.02)   # the next period: its limit, its correction unchanged
    state = _share(pacer, clock, 80, 15.0, 3, state)
    assert state[0] == pytest.approx(1.0, rel=0.02)
    state = _share(pacer, clock, 80, 0.3, 1, state)   # a trickle is idle
    assert state[0] == pytest.approx(30 / 80, rel=0.02)


def test_no_ceiling_no_burst_and_an_unreadable_nvml_means_no_burst():
    clock = Clock()
    assert _share(Pacer(clock), clock, 0, 0.0, 6)[0] == pytest.approx(1.0, rel=0.02)
    assert _share(Pacer(clock), clock, 20, 0.0, 6)[0] == pytest.approx(1.0, rel=0.02)   # a ceiling under the limit
    assert _share(Pacer(clock), clock, 80, None, 6)[0] == 1.0
    # the library's bound: a ceiling past five times the limit gives five times the limit
    assert _share(Pacer(clock), clock, 100, 0.0, 1)[0] == pytest.approx(max(FACTOR_MIN, 30 / 100))
