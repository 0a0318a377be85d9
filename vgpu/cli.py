"""The `vgpu` command: one parser built from the components' subcommands, then dispatch.

Each component's `cli` module exposes `register(subparsers)`; the shipped ones are imported here by name. The test
bed (`vgpu demo`) is not shipped in the production image and is not imported by anything: it adds its subcommand
through the `vgpu.subcommands` entry-point group, which exists only where it is installed. A plug-in that is
declared but fails to load is an error, never a silently missing subcommand.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, NoReturn

from vgpu import __version__
from vgpu.deviceplugin import cli as deviceplugin_cli
from vgpu.draplugin import cli as draplugin_cli
from vgpu.errors import ConfigError, VGPUError
from vgpu.isolation import cli as isolation_cli
from vgpu.isolation.doctor import cli as doctor_cli
from vgpu.planning import cli as planning_cli
from vgpu.replay import cli as replay_cli
from vgpu.scheduler import cli as scheduler_cli
from vgpu.webhook import cli as webhook_cli

__all__ = ["PLUGIN_GROUP", "build_parser", "main"]

PLUGIN_GROUP = "vgpu.subcommands"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
COMPONENTS: tuple[Callable[[Any], None], ...] = (
    scheduler_cli.register,
    deviceplugin_cli.register,
    draplugin_cli.register,
    isolation_cli.register,
    doctor_cli.register,
    replay_cli.register,
    planning_cli.register,
    webhook_cli.register,
)


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def _plugins() -> list[Callable[[Any], None]]:
    """The `register` functions of the installed plug-ins; raises ConfigError naming one that cannot load."""
    found = []
    for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda p: p.name):
        try:
            found.append(point.load())
        except Exception as exc:
            raise ConfigError(f"subcommand {point.name!r} ({point.value}) cannot be loaded: "
                              f"{type(exc).__name__}: {exc}") from exc
    return found


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (the usage itself is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand of this installation; `--log-level` is accepted before or after
    the subcommand."""
    parser = _Parser(prog="vgpu", description="GPU sharing for Kubernetes (Volcano compatible).")
    parser.add_argument("--version", action="version", version=f"vgpu-sharing {__version__}")
    level_help = f"logging level: {', '.join(LOG_LEVELS)} (default WARNING)"
    parser.add_argument("--log-level", type=_log_level, default="WARNING", help=level_help)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in (*COMPONENTS, *_plugins()):
        register(subparsers)
    for sub in subparsers.choices.values():
        sub.add_argument("--log-level", type=_log_level, default=argparse.SUPPRESS, help=level_help)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `vgpu` console script."""
    try:
        parser = build_parser()
    except VGPUError as exc:
        print(f"vgpu: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except VGPUError as exc:
        print(f"vgpu {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an input nothing validated: one line; the traceback at DEBUG
        logging.getLogger("vgpu").debug("unexpected error", exc_info=True)
        print(f"vgpu {args.command}: unexpected {type(exc).__name__}: {exc} (--log-level DEBUG shows where)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
