"""A tenant against the node's storage for per-container files: when the files of a container cannot be made (the
filesystem is full, a path is taken), that container is refused with one clear reason, nothing of it is left on
the node, and the plugin goes on serving the others.

The first test fills a real (private, size-limited) tmpfs as a tenant writing into its own accounting directory
would; the second runs the real `vgpu device-plugin` against the kubelet stand-in.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from capabilities import private_tmpfs
from dp_helpers import gpu_container

from vgpu.testbed.kubelet import AdmissionError

# Run inside the mount namespace: the node layer's host files on a 8 MiB tmpfs, a first container's accounting
# directory filled by its tenant, then a second container prepared.
FILL_AND_PREPARE = """
import os, sys
from vgpu.node.host import HostFiles
root = sys.argv[1]
host = HostFiles(root + "/hook", root + "/locks")
host.prepare("uid-a", "app")
try:
    with open(host.cache_dir("uid-a", "app") / "filler", "wb") as out:
        while True:
            out.write(b"x" * 65536)
except OSError:
    pass
try:
    host.prepare("uid-b", "app")
    print("prepared")
except OSError as exc:
    print("refused", exc.errno, exc)
print("containers", sorted(os.listdir(host.containers_root)))
print("locks", sorted(os.listdir(host.lock_root)))
"""


def test_a_tenant_filling_the_node_storage_gets_the_next_container_refused_before_anything_is_made(tmp_path):
    """Before: the second container's directories were created on the full filesystem and its admission failed
    later, with an unhandled `OSError: [Errno 28]`, leaving them behind."""
    private_tmpfs()
    root = tmp_path / "node"
    root.mkdir()
    script = f"mount -t tmpfs -o size=8m tmpfs {root} && exec {sys.executable} -c \"$0\" {root}"
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, FILL_AND_PREPARE],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("refused 28 "), lines
    assert "MiB free" in lines[0] and "needed" in lines[0], lines
    assert lines[1:] == ["containers ['uid-a_app']", "locks ['uid-a_app']"]


def test_a_container_whose_files_cannot_be_made_is_refused_with_nothing_left_behind(node):
    """The container's lock directory path is taken by a file: Allocate refuses that container with the reason, its
    accounting directory is removed again, and the next pod is admitted."""
    node.start_plugin("1xT4")
    (a,) = node.wait_inventory()
    blocked = node.create_pod("blocked", [gpu_container("app", 1, 1000, 10)], f"{a},NVIDIA,1000,10:")
    uid = blocked["metadata"]["uid"]
    node.lock.mkdir(parents=True, exist_ok=True)
    (node.lock / f"{uid}_app").write_text("taken")
    with pytest.raises(AdmissionError, match="cannot make the files of container") as caught:
        node.kubelet.admit(blocked)
    assert "File exists" in str(caught.value)
    assert not (node.hook / "vgpu" / "containers" / f"{uid}_app").exists()
    fine = node.create_pod("fine", [gpu_container("app", 1, 1000, 10)], f"{a},NVIDIA,1000,10:")
    (admitted,) = node.kubelet.admit(fine)
    assert admitted.responses["volcano.sh/vgpu-number"].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
