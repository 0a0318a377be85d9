"""A tenant against the node's storage for per-container files: when the files of a container cannot be made (the
filesystem is full, a path is taken), that container is refused with one clear reason, nothing of it is left on
the node, and the plugin goes on serving the others.

With `--container-storage tmpfs` (what deploy/ runs) each container's directories are tmpfs mounts of their own,
and a tenant filling them fills only its own. The filling tests run in a mount namespace of their own, on a private,
size-limited tmpfs standing for the node's filesystem, writing as a tenant into its own directories would; one test
runs the real `vgpu device-plugin` against the kubelet stand-in.
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


def _on_a_node_filesystem_of(tmp_path, size: str, script: str) -> list[str]:
    """Run `script` (its argument: the root) in a mount namespace of its own, with a tmpfs of `size` as the node's
    filesystem at the root; the lines it printed."""
    private_tmpfs()
    root = tmp_path / "node"
    root.mkdir()
    shell = f"mount -t tmpfs -o size={size} tmpfs {root} && exec {sys.executable} -c \"$0\" {root}"
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, script],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_a_tenant_filling_the_node_storage_gets_the_next_container_refused_before_anything_is_made(tmp_path):
    """Before: the second container's directories were created on the full filesystem and its admission failed
    later, with an unhandled `OSError: [Errno 28]`, leaving them behind."""
    lines = _on_a_node_filesystem_of(tmp_path, "8m", FILL_AND_PREPARE)
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


# Inside a mount namespace whose "node filesystem" is a 64 MiB tmpfs: the plugin's tmpfs storage, a first container's
# tenant filling its accounting directory and its lock directory, then a second container prepared and written.
FILL_OWN_TMPFS = """
import os, sys
from vgpu.node.host import HostFiles
root = sys.argv[1]
host = HostFiles(root + "/hook", root + "/locks", storage="tmpfs")
host.check_storage()
host.prepare("uid-a", "app")
written = 0
try:
    with open(host.cache_dir("uid-a", "app") / "filler", "wb", buffering=0) as out:
        while written < 256 << 20:
            out.write(b"x" * 65536)
            written += 65536
except OSError as exc:
    print("cache full", exc.errno, written >> 20)
made = 0
try:
    while made < 100000:
        (host.lock_dir("uid-a", "app") / f"lock{made}").touch()
        made += 1
except OSError as exc:
    print("locks full", exc.errno, made < 1000)
stat = os.statvfs(root)
print("node used MiB", (stat.f_blocks - stat.f_bfree) * stat.f_frsize >> 20)
host.prepare("uid-b", "app")
(host.cache_dir("uid-b", "app") / "vgpu.cache").write_bytes(b"y" * (2 << 20))
(host.lock_dir("uid-b", "app") / "lock").touch()
print("second container writes")
host.discard("uid-a", "app")
print("left", sorted(os.listdir(host.containers_root)), sorted(os.listdir(host.lock_root)))
print("mounted", os.path.ismount(host.cache_dir("uid-b", "app")), os.path.ismount(host.lock_dir("uid-b", "app")))
"""


def test_with_tmpfs_storage_a_tenant_fills_only_its_own_directories(tmp_path):
    """--container-storage tmpfs (what deploy/ runs): a tenant writing into its accounting directory stops at 8 MiB
    and at 256 files in its lock directory, the node's filesystem gains nothing, the next container's files are made
    and written, and a discarded container's mounts go with it (before: the tenant filled the node's filesystem)."""
    lines = _on_a_node_filesystem_of(tmp_path, "64m", FILL_OWN_TMPFS)
    assert lines[0] == "cache full 28 8", lines  # ENOSPC at its own 8 MiB
    assert lines[1] == "locks full 28 True", lines
    assert lines[2] == "node used MiB 0", lines
    assert lines[3:] == ["second container writes", "left ['uid-b_app'] ['uid-b_app']", "mounted True True"], lines


CHECK_WITHOUT_SYS_ADMIN = """
import sys
from vgpu.node.host import HostFiles
try:
    HostFiles(sys.argv[1] + "/hook", sys.argv[1] + "/locks", storage="tmpfs").check_storage()
    print("mounted")
except OSError as exc:
    print(exc.errno, exc.strerror)
"""


def test_tmpfs_storage_without_the_capability_is_one_clear_refusal(tmp_path):
    """A plugin told to use tmpfs storage without CAP_SYS_ADMIN finds out at its start, with what it needs."""
    private_tmpfs()
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "setpriv", "--bounding-set=-sys_admin",
                          "--inh-caps=-sys_admin", sys.executable, "-c", CHECK_WITHOUT_SYS_ADMIN, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("1 cannot mount a tmpfs under "), res.stdout
    assert "needs CAP_SYS_ADMIN, and Bidirectional mount propagation" in res.stdout
    assert not any((tmp_path / "hook" / "vgpu" / "containers").iterdir())  # the trial directory is gone
