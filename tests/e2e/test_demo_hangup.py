"""The live `vgpu demo` whose terminal goes away (SIGHUP) cleans up as on Ctrl-C: its cluster and every pod
process stop, the work directory is removed, and it exits 129 (before: six workload processes left running and
the work directory left behind)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _processes_under(path: str) -> list[int]:
    """PIDs whose command line names `path` (the demo's processes all run from its work directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if path.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_the_live_demo_cleans_up_when_its_terminal_hangs_up():
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "demo", "--hold", "30"], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.STDOUT)
    os.close(terminal)
    text = b""
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and b"Running" not in text.split(b"vgpu demo: up in")[-1]:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                text += os.read(controller, 65536)
            assert proc.poll() is None, text.decode(errors="replace")[-3000:]
        assert b"Running" in text.split(b"vgpu demo: up in")[-1], text.decode(errors="replace")[-3000:]
        workdir = re.search(rb"starting \S+ node\(s\) x \S+ in (\S+)", text).group(1).decode()
        assert _processes_under(workdir), "the demo's processes run from its work directory"
        os.close(controller)  # the terminal goes away ...
        controller = -1
        proc.send_signal(signal.SIGHUP)  # ... and its session gets SIGHUP
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if controller >= 0:
            os.close(controller)
    assert rc == 129, text.decode(errors="replace")[-3000:]
    assert not Path(workdir).exists()
    assert not _processes_under(workdir)
