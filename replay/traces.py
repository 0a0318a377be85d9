"""Public traces `vgpu replay` fetches by name, each file pinned by its SHA-256.

`openb` is the Alibaba Cluster Trace Program's cluster-trace-gpu-v2023 (Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23): one node list and pod lists
in which sharing tasks make up 20..100 % of GPU requests. The files are downloaded once from the program's GitHub
repository into a cache directory and checked against the digests below on every use; a file that does not match
is an error, never used. The program's terms allow use for research and study.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from vgpu.errors import ConfigError
from vgpu.units import MIB

__all__ = ["OPENB_FILES", "OPENB_POD_LISTS", "OPENB_URL", "cache_dir", "fetch", "openb"]

OPENB_URL = "https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-gpu-v2023/csv/"
OPENB_NODES = "openb_node_list_gpu_node.csv"
OPENB_FILES = {
    OPENB_NODES: "2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5",
    "openb_pod_list_default.csv": "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8",
    "openb_pod_list_gpushare20.csv": "9be2d0efb52e242c32e23dd184cc5fcc1983478c6c9c02cbb6b4b62925c0ffcd",
    "openb_pod_list_gpushare40.csv": "d83ce79a4eb6987524bedbb0c65e41aed3a36bf6c1b78b86234c3687a07e1d40",
    "openb_pod_list_gpushare60.csv": "d31809628128a1f24491086eda4af3e23882b9213d3ef57a56ee2d1af69492fe",
    "openb_pod_list_gpushare80.csv": "88b6649369ced40d0fde287d2498ea61ff4b05fccba8bdc95daf6042f2f8431e",
    "openb_pod_list_gpushare100.csv": "12dbc07d6a49bf8641e2275a2ff5bf7be74b5df7d148d531e135b140b95f9a3d",
}
OPENB_POD_LISTS = ("default", "gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100")


def cache_dir() -> Path:
    """Where fetched traces are kept: $VGPU_CACHE_DIR, else $XDG_CACHE_HOME/vgpu-sharing, else
    ~/.cache/vgpu-sharing (a `traces` folder inside)."""
    root = os.environ.get("VGPU_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vgpu-sharing")
    return Path(root) / "traces"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def fetch(name: str, sha256: str, base_url: str, directory: Path) -> Path:
    """`directory/name`, downloaded from `base_url + name` unless a copy with digest `sha256` is already there;
    raises ConfigError (nothing is kept) when it cannot be downloaded or its digest differs."""
    target = directory / name
    if target.is_file() and _digest(target) == sha256:
        return target
    directory.mkdir(parents=True, exist_ok=True)
    url = base_url + name
    fd, partial = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            for block in iter(lambda: response.read(MIB), b""):
                out.write(block)
        got = _digest(Path(partial))
        if got != sha256:
            raise ConfigError(f"trace file {url}: SHA-256 {got} is not the pinned {sha256}; not used")
        os.replace(partial, target)
    except (urllib.error.URLError, OSError) as exc:
        raise ConfigError(f"trace file {url}: cannot download it ({exc}); copy it to {target} by hand") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def openb(pods: str = "default", base_url: str = OPENB_URL, directory: Path | None = None) -> tuple[Path, Path]:
    """The openb node list and pod list `pods` (default, gpushare20, ... gpushare100), fetched when not cached."""
    if pods not in OPENB_POD_LISTS:
        raise ConfigError(f"--trace: openb has no pod list {pods!r} (known: {', '.join(OPENB_POD_LISTS)})")
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    where = directory or cache_dir() / "openb"
    pod_file = f"openb_pod_list_{pods}.csv"
    return (fetch(OPENB_NODES, OPENB_FILES[OPENB_NODES], base_url, where),
            fetch(pod_file, OPENB_FILES[pod_file], base_url, where))
