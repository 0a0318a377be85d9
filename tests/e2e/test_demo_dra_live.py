"""`vgpu demo --dra` on a terminal is live, as `vgpu demo` is: it redraws a table of the pods and what their claims
were allocated, and keeps the cluster up for `--duration` after the samples have ended (before: it ended with its
pods and ignored `--duration`)."""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DURATION = 45.0


@pytest.mark.slow
def test_the_dra_demo_on_a_terminal_redraws_its_claims_until_the_duration():
    workdir = Path(tempfile.mkdtemp(prefix="dl-", dir="/tmp"))  # gRPC binds unix sockets of 105 bytes at most
    controller, terminal = pty.openpty()
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "demo", "--dra", "--hold", "1", "--duration",
                             f"{DURATION:g}", "--workdir", str(workdir / "demo")], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=terminal, stderr=subprocess.STDOUT)
    os.close(terminal)
    chunks: list[bytes] = []
    up_at = None
    try:
        while time.monotonic() - started < DURATION + 300:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                try:
                    data = os.read(controller, 65536)
                except OSError:  # the terminal's other end closed: the demo ended
                    break
                if not data:
                    break
                chunks.append(data)
                if up_at is None and b"vgpu demo: up;" in b"".join(chunks):
                    up_at = time.monotonic()
            elif proc.poll() is not None:
                break
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
        shutil.rmtree(workdir, ignore_errors=True)
    text = b"".join(chunks).decode(errors="replace")
    assert rc == 0 and "vgpu demo: PASS" in text, text[-4000:]
    frames = text.split("\x1b[H\x1b[2J")
    assert len(frames) > 10, text[-2000:]
    final = frames[-1]
    assert "CLAIMED" in frames[-2] and "share-0" in frames[-2], frames[-2]
    assert "cores=30" in text and "memory=" in text, text[-3000:]
    assert "Succeeded" in frames[-2]  # the samples had ended, and the table was still redrawn
    assert up_at is not None and time.monotonic() - up_at >= DURATION - 1, "ended before --duration"
    assert "summary:" in final
