"""Worker processes: start `python -m vgpu.isolation.doctor.worker ACTION PARAMS`, talk to it, time-box it.

A worker writes JSON lines on its stdout (messages, then its verdict: the line with "ok") and anything else on
stderr, which is kept in a file so that a verdict can quote its end. The doctor starts each probe's worker in a
session of its own; the worker's helpers (a second process, a run without the library) stay in that session, so
killing the session at the time box leaves nothing behind.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from vgpu.isolation.doctor.outcome import Outcome

WORKER_MODULE = "vgpu.isolation.doctor.worker"
log = logging.getLogger("vgpu.doctor")


def exit_text(code: int) -> str:
    """`exit status 3` or `signal SIGSEGV`."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class Worker:
    """One worker process. `session=True` (the doctor's probes) puts it and its helpers in a session of their own;
    `interactive=True` gives it a stdin to `send` lines to."""

    def __init__(self, action: str, params: Mapping[str, Any], env: Mapping[str, str], workdir: Path,
                 session: bool = False, interactive: bool = False) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.action = action
        self.session = session
        # the worker's stderr, kept for the verdicts to quote: closed by close()
        self._err: IO[bytes] = tempfile.TemporaryFile(dir=workdir, prefix=f"{action}-", suffix=".stderr")  # noqa: SIM115
        self._buf = b""
        self._eof = False
        argv = [sys.executable, "-m", WORKER_MODULE, action, json.dumps(dict(params))]
        self.proc = subprocess.Popen(argv, env=dict(env), stdin=subprocess.PIPE if interactive else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._err, start_new_session=session)
        log.debug("event=worker-start action=%s pid=%d session=%s", action, self.proc.pid, session)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.proc.pid

    def send(self, line: str) -> None:
        """Write one line to the worker's stdin (an interactive worker that has gone is ignored)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def message(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line the worker wrote; None at its end or after `timeout` seconds."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, _, self._buf = self._buf.partition(b"\n")
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                if isinstance(data, dict):
                    return data
            if self._eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if chunk:
                self._buf += chunk
            else:
                self._eof = True
                self._buf += b"\n"

    def result(self, timeout: float) -> Outcome:
        """The worker's verdict (the first JSON line with "ok"), waiting at most `timeout` seconds for it and for the
        worker to end. Past that the worker (and, with a session, everything it started) is killed: without a
        verdict the outcome says it ran past its time box; a verdict already given stands."""
        deadline = time.monotonic() + timeout
        verdict: dict[str, Any] | None = None
        while verdict is None and (msg := self.message(max(0.0, deadline - time.monotonic()))) is not None:
            if "ok" in msg:
                verdict = msg
        if verdict is None and not self._eof:
            return self._timed_out(timeout)
        try:
            code = self.proc.wait(timeout=max(0.5, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if verdict is None:
                return self._timed_out(timeout)
            self.kill()           # it gave its verdict, then hung on the way out: the verdict stands
            return Outcome.from_json(verdict)
        if verdict is None:
            return Outcome.failed(f"worker ended with {exit_text(code)} and gave no verdict" + self.stderr_tail())
        return Outcome.from_json(verdict)

    def _timed_out(self, timeout: float) -> Outcome:
        self.kill()
        log.debug("event=worker-timeout action=%s pid=%d timebox=%.0f", self.action, self.pid, timeout)
        return Outcome.failed(f"did not finish within its time box of {timeout:.0f} s (killed)" + self.stderr_tail())

    def kill(self) -> None:
        """SIGKILL the worker (with a session: its whole session) and reap it."""
        try:
            if self.session:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:
                self.proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def stderr_tail(self, lines: int = 4) -> str:
        """`; stderr: ...` with the last lines the worker wrote there, or ""."""
        self._err.seek(0)
        text = self._err.read().decode(errors="replace").strip().splitlines()[-lines:]
        return "; stderr: " + " | ".join(t.strip() for t in text) if text else ""

    def close(self) -> None:
        """Kill what is left (a session is always killed: helpers must not outlive it) and close the files."""
        if self.session or self.proc.poll() is None:
            self.kill()
        for f in (self.proc.stdin, self.proc.stdout, self._err):
            if f is not None:
                f.close()
