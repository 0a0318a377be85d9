"""One doctor run: each probe in a worker of its own, one after another, each time-boxed, in a fresh folder (its
accounting file, the helpers' files) that is removed when it ends."""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpu.isolation.doctor import envs
from vgpu.isolation.doctor.catalog import CLOCK, LIMITED, Probe, Settings
from vgpu.isolation.doctor.discover import Library
from vgpu.isolation.doctor.outcome import Outcome
from vgpu.isolation.doctor.spawn import Worker

HANG_HOOK = "VGPU_DOCTOR_TEST_HANG"   # tests: "PROBE:SECONDS" makes PROBE hang and gives it that time box
log = logging.getLogger("vgpu.doctor")


@dataclass(slots=True)
class Result:
    """A probe and what it found."""

    probe: Probe
    outcome: Outcome
    seconds: float


@dataclass(slots=True)
class Run:
    """Everything the probes of one run share."""

    settings: Settings
    library: Library
    driver_dir: str | None
    facts: dict[str, Any]
    workdir: Path
    hang: dict[str, float] = field(default_factory=dict)
    device_ns: dict[str, float] | None = None         # from kernel-clock, once it has run
    clock_problem: str = "kernel-clock did not run"

    def params(self, probe: Probe, folder: Path) -> dict[str, Any]:
        """The worker parameters of `probe`."""
        params = {**self.settings.params(), **probe.args, "lib": self.library.path, "driver_dir": self.driver_dir,
                  "workdir": str(folder), "devices": self.settings.devices, "cores": probe.cores,
                  "nvml_error": self.facts.get("nvml_error")}
        if self.device_ns is not None:
            params["device_ns"] = self.device_ns
        if probe.name in self.hang:
            params["hang"] = True
        return params

    def env(self, probe: Probe, folder: Path) -> dict[str, str]:
        """The environment of `probe`'s worker."""
        if probe.env == LIMITED:
            return envs.limited_env(os.environ, self.driver_dir, self.library.path, folder / "vgpu.cache",
                                    self.settings.limit, self.settings.devices, probe.cores)
        return envs.reference_env(os.environ, self.driver_dir)

    def one(self, probe: Probe) -> Outcome:
        """Run `probe` to its verdict (or its time box)."""
        if probe.needs_clock and self.device_ns is None:
            return Outcome.skip(f"needs the kernel timings: {self.clock_problem}")
        folder = self.workdir / probe.name
        timebox = self.hang.get(probe.name, probe.timebox(self.settings))
        log.debug("event=probe-start probe=%s timebox=%.0f", probe.name, timebox)
        try:
            with Worker(probe.action or probe.name, self.params(probe, folder), self.env(probe, folder), folder,
                        session=True) as worker:
                return worker.result(timebox)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def all(self, probes: Sequence[Probe], progress: Callable[[int, int, Result], None]) -> list[Result]:
        """Every probe in order; `progress(i, n, result)` after each."""
        results = []
        for i, probe in enumerate(probes, 1):
            t0 = time.monotonic()
            outcome = self.one(probe)
            if probe.name == CLOCK:
                if outcome.ok and not outcome.skipped:
                    self.device_ns = dict(outcome.figures["device_ns"])
                else:
                    how = "was skipped" if outcome.skipped else "failed"
                    self.clock_problem = f"kernel-clock {how}: {outcome.reason}"
            result = Result(probe, outcome, time.monotonic() - t0)
            log.debug("event=probe-end probe=%s ok=%s skipped=%s seconds=%.2f", probe.name, outcome.ok,
                      outcome.skipped, result.seconds)
            results.append(result)
            progress(i, len(probes), result)
        return results


def hang_hook(value: str | None) -> dict[str, float]:
    """Parse VGPU_DOCTOR_TEST_HANG ("PROBE:SECONDS[,PROBE:SECONDS]")."""
    hooks = {}
    for item in (value or "").split(","):
        name, _, seconds = item.strip().partition(":")
        if name:
            hooks[name] = float(seconds or 5)
    return hooks
