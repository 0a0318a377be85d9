"""`vgpu device-plugin`: the kubelet device plugin, node inventory publisher and node monitor in one process.

Parses and dispatches only: options (flags, environment variables, the two files and their precedence) are defined
in vgpu.deviceplugin.config.OPTIONS (`--help` lists each with its default and environment name), the wiring is
vgpu.deviceplugin.runtime. The process runs until SIGTERM / SIGINT and removes its sockets on the way out.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the `device-plugin` subcommand; its options come from vgpu.deviceplugin.config.OPTIONS."""
    from vgpu.deviceplugin.config import CONFIG_FILE_ENV, CONFIG_FILE_FLAG, OPTIONS

    p = subparsers.add_parser(
        "device-plugin",
        help="run the kubelet device plugin and node monitor",
        description="Advertise split GPUs to kubelet, answer Allocate, publish the node inventory, serve metrics.",
        epilog="Precedence: flag > environment > --config-file > --config > default. Booleans take true/false "
        "(a bare boolean flag means true). Every option: docs/deviceplugin-options.md.",
    )
    p.add_argument("--config", metavar="FILE",
                   help="component YAML file with the sharing section shared with the scheduler "
                        "(deploy/: device-plugin.yaml) (default none)")
    p.add_argument(CONFIG_FILE_FLAG, dest="config_file", metavar="FILE",
                   help=f"options file in the NVIDIA device plugin's layout (version: v1, flags: ...) "
                        f"(default none; env {CONFIG_FILE_ENV})")
    for option in OPTIONS:
        where = [f"default {option.default}"]
        if option.env:
            where.append(f"env {option.env}")
        if option.file_key:
            where.append(f"file {option.file_key}")
        text = f"{option.help}" + (f" [{', '.join(option.choices)}]" if option.choices else "")
        text += f" ({'; '.join(where)})"
        kwargs: dict[str, Any] = {"dest": option.field.replace(".", "__"), "help": text.replace("%", "%%")}
        if option.kind == "bool":
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        else:
            kwargs["metavar"] = option.flag.lstrip("-").replace("-", "_").upper()
        p.add_argument(option.flag, **kwargs)
    p.set_defaults(func=run)


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    from vgpu.deviceplugin.config import OPTIONS

    return {o.field: getattr(args, o.field.replace(".", "__"), None) for o in OPTIONS}


def run(args: argparse.Namespace) -> int:
    """Start everything and block until SIGTERM or SIGINT."""
    from vgpu.deviceplugin.config import resolve_config
    from vgpu.deviceplugin.runtime import DevicePluginRuntime
    from vgpu.node.process import serve_until_signalled

    config = resolve_config(args.config, _flags(args), os.environ, args.config_file)
    return serve_until_signalled("vgpu device-plugin", lambda: DevicePluginRuntime(config))
