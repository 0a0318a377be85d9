"""`vgpu replay --trace openb`: trace files fetched over HTTP (a local server stands in for GitHub), kept only when
their SHA-256 is the pinned one, used from the cache afterwards without the network."""
from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpu.errors import ConfigError
from vgpu.replay.traces import OPENB_FILES, fetch

NODES = b"sn,cpu_milli,memory_mib,gpu,model\nnode-0,96000,786432,2,T4\n"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """An HTTP server of the files in a folder: (base URL, the folder, the paths it was asked for)."""
    root = tmp_path / "served"
    root.mkdir()
    asked: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            asked.append(self.path)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", root, asked
    httpd.shutdown()
    httpd.server_close()


def test_a_file_with_the_pinned_digest_is_kept_and_then_read_from_the_cache(server, tmp_path):
    url, root, asked = server
    (root / "nodes.csv").write_bytes(NODES)
    digest = hashlib.sha256(NODES).hexdigest()
    cache = tmp_path / "cache"
    assert fetch("nodes.csv", digest, url, cache).read_bytes() == NODES
    assert len(asked) == 1
    (root / "nodes.csv").unlink()                      # the network has nothing now: the cached copy serves
    assert fetch("nodes.csv", digest, "http://127.0.0.1:9/", cache).read_bytes() == NODES
    assert len(asked) == 1
    assert sorted(p.name for p in cache.iterdir()) == ["nodes.csv"]


def test_a_file_with_another_digest_is_refused_and_nothing_is_kept(server, tmp_path):
    url, root, _ = server
    (root / "nodes.csv").write_bytes(NODES)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"SHA-256 \w+ is not the pinned"):
        fetch("nodes.csv", "0" * 64, url, cache)
    assert list(cache.iterdir()) == []


def test_a_cached_copy_that_was_altered_is_fetched_again(server, tmp_path):
    url, root, asked = server
    (root / "nodes.csv").write_bytes(NODES)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "nodes.csv").write_bytes(NODES + b"node-9,1,1,8,A100\n")
    assert fetch("nodes.csv", hashlib.sha256(NODES).hexdigest(), url, cache).read_bytes() == NODES
    assert len(asked) == 1


def _replay(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, VGPU_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "vgpu.cli", "replay", *args, "--seeds", "1", "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_cli_refuses_a_trace_that_does_not_match_in_one_line(server, tmp_path):
    url, root, asked = server
    for name in OPENB_FILES:
        (root / name).write_bytes(NODES)               # right names, wrong contents
    res = _replay(tmp_path, "--trace", "openb:gpushare40", "--trace-url", url)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "is not the pinned" in res.stderr and "openb_node_list_gpu_node.csv" in res.stderr
    assert asked == ["/openb_node_list_gpu_node.csv"]
    assert not any((tmp_path / "cache").rglob("*.csv"))


@pytest.mark.parametrize("args, message", [
    (["--trace", "openb", "--nodes", "n.csv"], "one or the other"),
    (["--pods", "p.csv"], "give --trace openb, or both --nodes and --pods"),
    (["--trace", "philly"], "unknown trace 'philly'"),
    (["--trace", "openb:gpushare30"], "no pod list 'gpushare30'"),
    (["--trace", "openb", "--trace-url", "http://127.0.0.1:9/"], "cannot download it"),
])
def test_the_cli_explains_what_is_wrong_with_the_trace_in_one_line(tmp_path, args, message):
    res = _replay(tmp_path, *args)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert message in res.stderr, res.stderr
