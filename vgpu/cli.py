"""The `vgpu` command: builds one parser from the components' subcommands and dispatches.

Each component with a subcommand has a module `<package>.cli` exposing `register(subparsers)`; only the ones
present in this installation are listed.
"""

import argparse
import importlib
import importlib.util
import logging
import sys

from vgpu import __version__
from vgpu.errors import VGPUError

__all__ = ["main", "build_parser"]

_COMPONENT_CLIS = (
    "scheduler.cli",
    "scheduler.replay_cli",
    "deviceplugin.cli",
    "isolation.cli",
    "vgpu.demo_cli",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="vgpu", description="GPU sharing for Kubernetes (Volcano compatible).")
    parser.add_argument("--version", action="version", version=f"vgpu-sharing {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMPONENT_CLIS:
        if importlib.util.find_spec(module_name) is None:
            continue
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `vgpu` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    try:
        return int(args.func(args) or 0)
    except VGPUError as exc:
        print(f"vgpu {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
