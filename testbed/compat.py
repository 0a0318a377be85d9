"""TEST INFRASTRUCTURE: thin adapters between the e2e harness and the components' command lines / stand-ins.

The harness (testbed/cluster.py) starts our real components unmodified; the few places where it must know
how a component spells a flag or where a stand-in puts a socket are collected here so that a change in one of
them is a one-line change.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["kubelet_ready", "plugin_flags", "sim_control_args"]


def plugin_flags() -> set[str]:
    """The option strings `vgpu device-plugin` accepts (empty if the command is not installed)."""
    try:
        from vgpu.deviceplugin import cli as dp_cli
    except ImportError:
        return set()
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    dp_cli.register(sub)
    flags: set[str] = set()
    for action in sub.choices.get("device-plugin", argparse.ArgumentParser())._actions:
        flags.update(action.option_strings)
    return flags


def sim_control_args(control_file: Path) -> list[str]:
    """The device-plugin arguments that point the simulated backend at its fault-injection control file."""
    flags = plugin_flags()
    for flag in ("--sim-control", "--sim-control-file"):
        if flag in flags:
            return [flag, str(control_file)]
    return []


def kubelet_ready(kubelet_dir: Path) -> bool:
    """The kubelet stand-in serves its Registration socket."""
    return (Path(kubelet_dir) / "kubelet.sock").exists()
