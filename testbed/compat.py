"""TEST INFRASTRUCTURE: thin adapters between the e2e harness and the stand-ins.

The harness (testbed/cluster.py) starts our real components unmodified; the few places where it must know where a
stand-in puts a socket are collected here so that a change in one of them is a one-line change.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["kubelet_ready"]


def kubelet_ready(kubelet_dir: Path) -> bool:
    """The kubelet stand-in serves its Registration socket."""
    return (Path(kubelet_dir) / "kubelet.sock").exists()
