"""node.driverlimits: finding a container's cgroup the way kubelet's cgroup drivers lay them out, and the
container IDs of a pod's running containers. (The limits themselves are tested end to end over the simulated
NVML in tests/e2e/test_e2e_nvml.py.)"""

from __future__ import annotations

from vgpu.node.driverlimits import CgroupFinder, container_ids

UID = "6c9e5dc0-97da-5a9c-bc1b-a8a290a25129"
CID = "4f1d2a9b8c7e6d5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f"


def test_cgroupfs_layout(tmp_path):
    ctr = tmp_path / "kubepods" / "burstable" / f"pod{UID}" / CID
    ctr.mkdir(parents=True)
    (tmp_path / "kubepods" / "burstable" / f"pod{UID}" / ("0" + CID[1:])).mkdir()
    assert CgroupFinder(tmp_path).find(UID, CID) == ctr


def test_systemd_layout(tmp_path):
    pod = tmp_path / "kubepods.slice" / "kubepods-besteffort.slice" / \
        f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
    ctr = pod / f"cri-containerd-{CID}.scope"
    ctr.mkdir(parents=True)
    finder = CgroupFinder(tmp_path)
    assert finder.find(UID, CID) == ctr
    assert finder.find(UID, "deadbeef") is None
    assert finder.find("other-uid", CID) is None


def test_a_cgroup_that_appears_later_is_found(tmp_path):
    finder = CgroupFinder(tmp_path)
    assert finder.find(UID, CID) is None
    ctr = tmp_path / f"pod{UID}" / CID
    ctr.mkdir(parents=True)
    assert finder.find(UID, CID) == ctr


def test_container_ids_of_running_containers_only():
    pod = {"status": {"containerStatuses": [
        {"name": "main", "containerID": f"containerd://{CID}", "state": {"running": {}}},
        {"name": "done", "containerID": "containerd://abc", "state": {"terminated": {"exitCode": 0}}},
        {"name": "waiting", "state": {"waiting": {}}},
    ]}}
    assert container_ids(pod) == {"main": CID}
