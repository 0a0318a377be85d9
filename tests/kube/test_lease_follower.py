"""Following another program's Lease (vgpu.kube.leader.LeaseFollower): the extender leads exactly while the
kube-scheduler of its own pod does. Two LeaderElectors named as kube-scheduler names itself (`<hostname>_<uuid>`)
stand for the two kube-schedulers of two replicas, over the API-server stand-in; the followers read the same Lease.
The real kube-scheduler's own leader election is the judge in tests/realk8s/test_realk8s_ha.py."""

from __future__ import annotations

import threading
import time

import pytest

from vgpu.errors import ConfigError
from vgpu.kube import LeaderElector, LeaseFollower, make_api_client
from vgpu.testbed.apiserver import write_kubeconfig

LEASE = dict(name="vgpu-kube-scheduler", namespace="vgpu-system")
ELECTION = dict(lease_duration=2.0, renew_deadline=1.2, retry_period=0.1)  # kube-scheduler's 15/10/2 s, scaled


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Watcher:
    """Samples which followers lead, every 10 ms, until stopped; `overlaps` counts samples with two leaders."""

    def __init__(self, followers: dict[str, LeaseFollower]) -> None:
        self.followers = followers
        self.overlaps = 0
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            leading = [name for name, follower in self.followers.items() if follower.holds_lease()]
            self.overlaps += len(leading) > 1
            if leading and (not self.seen or self.seen[-1] != leading[0]):
                self.seen.append(leading[0])

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2)


def test_the_follower_beside_the_leading_kube_scheduler_leads_and_only_it(api):
    events: list[str] = []
    followers = {pod: LeaseFollower(api, **LEASE, identity=pod, renew_deadline=1.2, poll_period=0.1,
                                    on_started_leading=lambda pod=pod: events.append(f"{pod}+"),
                                    on_stopped_leading=lambda pod=pod: events.append(f"{pod}-"))
                 for pod in ("vgpu-scheduler-a", "vgpu-scheduler-b")}
    schedulers = {pod: LeaderElector(api, **LEASE, identity=f"{pod}_3f2b9c1e-{pod[-1]}", **ELECTION)
                  for pod in followers}
    try:
        for follower in followers.values():
            follower.start()
        assert not any(f.holds_lease() for f in followers.values())
        assert "has no holder" in followers["vgpu-scheduler-a"].why_not_leading() \
            or "cannot read" in followers["vgpu-scheduler-a"].why_not_leading()
        with Watcher(followers) as watcher:
            schedulers["vgpu-scheduler-a"].start()
            assert schedulers["vgpu-scheduler-a"].wait_for_leadership(5)
            _wait(followers["vgpu-scheduler-a"].holds_lease, 3, "a's follower to lead")
            schedulers["vgpu-scheduler-b"].start()
            time.sleep(1.0)  # b's kube-scheduler campaigns while a's renews: b's follower stays a standby
            assert not followers["vgpu-scheduler-b"].holds_lease()
            assert followers["vgpu-scheduler-b"].why_not_leading() == (
                "not the leader: Lease vgpu-system/vgpu-kube-scheduler is held by "
                f"{schedulers['vgpu-scheduler-a'].identity}, not by vgpu-scheduler-b")
            # a's kube-scheduler dies without releasing: its follower stops within renew_deadline, b's kube-scheduler
            # takes over after the lease duration, and b's follower follows it
            schedulers["vgpu-scheduler-a"].stop(release=False)
            _wait(lambda: not followers["vgpu-scheduler-a"].holds_lease(), 2, "a's follower to stop")
            assert "was not renewed" in followers["vgpu-scheduler-a"].why_not_leading()
            assert schedulers["vgpu-scheduler-b"].wait_for_leadership(5)
            _wait(followers["vgpu-scheduler-b"].holds_lease, 3, "b's follower to lead")
            # a graceful stop releases the Lease: the follower stops at once
            schedulers["vgpu-scheduler-b"].stop()
            _wait(lambda: not followers["vgpu-scheduler-b"].holds_lease(), 1, "b's follower to stop")
        assert watcher.overlaps == 0 and watcher.seen == ["vgpu-scheduler-a", "vgpu-scheduler-b"]
        assert events == ["vgpu-scheduler-a+", "vgpu-scheduler-a-", "vgpu-scheduler-b+", "vgpu-scheduler-b-"]
    finally:
        for elector in schedulers.values():
            elector.stop(release=False)
        for follower in followers.values():
            follower.stop()


def test_a_follower_cut_off_from_the_api_server_stops_before_another_pair_may_start(api, apiserver, tmp_path):
    """The follower's reads hang (a partition of its replica alone): it stops leading renew_deadline after the last
    renewal it saw, though the Lease still names its pod, which is before a standby may take over."""
    cut = make_api_client(write_kubeconfig(tmp_path / "cut.kubeconfig", apiserver.url, token="cut-off"))
    scheduler = LeaderElector(api, **LEASE, identity="vgpu-scheduler-a_1", **ELECTION).start()
    follower = LeaseFollower(cut, **LEASE, identity="vgpu-scheduler-a", renew_deadline=1.2, poll_period=0.1)
    try:
        assert scheduler.wait_for_leadership(5)
        follower.start()
        _wait(follower.holds_lease, 3, "the follower to lead")
        apiserver.faults.set([{"action": "timeout", "path": "/leases", "token": "cut-off", "seconds": 5}])
        cut_at = time.monotonic()
        _wait(lambda: not follower.holds_lease(), 3, "the cut-off follower to stop")
        assert time.monotonic() - cut_at < ELECTION["lease_duration"]
        assert scheduler.holds_lease()  # the Lease still names its pod
        apiserver.faults.clear()
        _wait(follower.holds_lease, 12, "the follower to lead again once it reads the Lease")
    finally:
        apiserver.faults.clear()
        scheduler.stop(release=False)
        follower.stop()
        cut.close()


def test_only_the_hostname_before_the_underscore_is_ours(api):
    scheduler = LeaderElector(api, **LEASE, identity="vgpu-scheduler-ab_9", **ELECTION).start()
    near = LeaseFollower(api, **LEASE, identity="vgpu-scheduler-a", renew_deadline=1.2, poll_period=0.1)
    exact = LeaseFollower(api, **LEASE, identity="vgpu-scheduler-ab", renew_deadline=1.2, poll_period=0.1)
    try:
        assert scheduler.wait_for_leadership(5)
        near.start()
        exact.start()
        _wait(exact.holds_lease, 3, "the follower of the same hostname")
        assert not near.holds_lease()
    finally:
        scheduler.stop(release=False)
        near.stop()
        exact.stop()


def test_timings_that_cannot_fence_are_refused(api):
    with pytest.raises(ConfigError, match="renew_deadline > poll_period"):
        LeaseFollower(api, **LEASE, renew_deadline=1.0, poll_period=1.0)
