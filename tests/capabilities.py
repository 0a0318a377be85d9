"""What some tests need from the machine, and the one switch that makes its absence a failure.

A test that needs a tool or a kernel feature this machine may lack asks here. Where it is missing the test skips,
unless the environment variable VGPU_REQUIRE names it (a comma list of the names below), where it fails: `.ci/run`
names everything a CI machine provides, so CI cannot go green by skipping.

Names: a tool on PATH by its command name (kubectl, promtool, prometheus, strace, unshare, aarch64-linux-gnu-gcc,
qemu-aarch64), `podman` (podman and runc usable as root: testbed/container_runtime.py), and the features
`pid-namespace`, `mount-namespace` (a private tmpfs mount), `cgroup-v2` (cgroups this process may create),
`port-8888` (the extender's default port is free), `libvgpu-build` (gcc and cuda.h), `real-kubernetes` (the
upstream programs testbed/upstream/build.sh builds, run by tests/realk8s: testbed/realcluster.py) and `actionlint`
(built by testbed/actionlint/build.sh with the Go toolchain).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import NoReturn

import pytest

SWITCH = "VGPU_REQUIRE"


def required() -> set[str]:
    """The capabilities VGPU_REQUIRE says this machine must have."""
    return {name.strip() for name in os.environ.get(SWITCH, "").split(",") if name.strip()}


def missing(name: str, detail: str) -> NoReturn:
    """The test cannot run here for want of `name`: fail where it is required, skip otherwise."""
    if name in required():
        pytest.fail(f"{name} is required ({SWITCH}) but not available here: {detail}")
    pytest.skip(f"{name} is not available here: {detail}")


def tool(name: str, where: str) -> str:
    """The path of command `name`; `where` says where it comes from (a package, a URL)."""
    path = shutil.which(name)
    if path is None:
        missing(name, f"install it from {where}")
    return path


def private_tmpfs() -> None:
    """This machine can mount a private tmpfs in a mount namespace (`unshare --mount`, as root); else `missing`."""
    try:
        ok = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=64k",
                             "tmpfs", "/mnt"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        missing("mount-namespace", "unshare --mount cannot mount a private tmpfs here")

