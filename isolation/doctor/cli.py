"""`vgpu doctor` (and `python -m vgpu.isolation.doctor`): check on this node that libvgpu.so's limits hold.

Exit status: 0 when every probe passed or was skipped, 1 when a probe found a limit broken (or timed out), 2 when
the doctor could not start (a bad flag, no driver, no library): then it prints one line.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from vgpu.errors import VGPUError
from vgpu.isolation.doctor import discover, report
from vgpu.isolation.doctor.catalog import NAMES, Settings, select
from vgpu.isolation.doctor.session import HANG_HOOK, Run, hang_hook

DESCRIPTION = ("Prove, with this node's driver and frameworks, that libvgpu.so's memory and compute limits hold: "
               "each probe runs in a process of its own under the library with limits, and a table of what each "
               "found ends the run. Exit status 1 when a limit is broken.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The doctor's flags."""
    p.add_argument("--driver-dir", help="directory searched first for libcuda.so.1 and libnvidia-ml.so.1")
    p.add_argument("--lib", help="the libvgpu.so to check (default: /usr/local/vgpu/libvgpu.so where the device "
                                 "plugin installed it, else this package's own build)")
    p.add_argument("--json", metavar="FILE", help="also write the findings as JSON to FILE")
    p.add_argument("--quick", action="store_true", help="shorter timed windows (about half the run time)")
    p.add_argument("--probe", action="append", choices=NAMES, metavar="NAME",
                   help="run only this probe (repeatable; kernel-clock is added when needed): " + ", ".join(NAMES))


def register(subparsers: Any) -> None:
    """Add the `doctor` subcommand."""
    p = subparsers.add_parser("doctor", help="check on this GPU node that libvgpu.so's limits hold",
                              description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)      # unwinds, so the running probe's session is killed on the way out


def run(args: argparse.Namespace) -> int:
    """Run the doctor; raises DoctorError (a VGPUError) when it cannot start."""
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    driver_dir = discover.check_driver_dir(args.driver_dir)
    json_path = Path(args.json) if args.json else None
    if json_path is not None and not json_path.resolve().parent.is_dir():
        raise discover.DoctorError(f"--json {args.json}: its directory does not exist")
    library = discover.find_library(args.lib)
    with tempfile.TemporaryDirectory(prefix="vgpu-doctor-") as tmp:
        workdir = Path(tmp)
        facts = discover.driver_facts(driver_dir, workdir)
        first = facts["devices"][0]
        settings = Settings.choose(args.quick, int(first["total_bytes"]), len(facts["devices"]))
        doctor = Run(settings, library, driver_dir, facts, workdir, hang_hook(os.environ.get(HANG_HOOK)))
        probes = select(args.probe)
        print(f"vgpu doctor: {first['name']} (CUDA {facts['cuda_version']}), {library.path}, {len(probes)} probes",
              file=sys.stderr, flush=True)
        results = doctor.all(probes, lambda i, n, r: print(report.progress_line(i, n, r), file=sys.stderr,
                                                                flush=True))
    seconds = time.monotonic() - started
    code = 1 if any(not r.outcome.ok for r in results) else 0
    print(report.header(doctor))
    print()
    print(report.table(results))
    print()
    print(report.verdict(results, seconds))
    if json_path is not None:
        report.write_json(json_path, report.document(doctor, results, seconds, code))
    return code


class _Parser(argparse.ArgumentParser):
    """Usage errors on one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    """`python -m vgpu.isolation.doctor`: the same command without the rest of `vgpu` (a plain checkout runs it)."""
    parser = _Parser(prog="vgpu doctor", description=DESCRIPTION)
    add_arguments(parser)
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level (default WARNING)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        stream=sys.stderr)
    try:
        return run(args)
    except VGPUError as exc:
        print(f"vgpu doctor: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
