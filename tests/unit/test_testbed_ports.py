"""The harness's preferred ports (the contract's :9394 and :9395): two clusters started at the same moment, in one
process or two (two `vgpu demo`s), never both take one that neither has bound yet (before: the second demo's device
plugin died with `Errno 98 Address already in use`)."""

from __future__ import annotations

import subprocess
import sys

from vgpu.testbed.cluster import free_port, port_or_free, release_port

HOLD = "import sys, time\nfrom vgpu.testbed.cluster import port_or_free\nprint(port_or_free(int(sys.argv[1])), " \
       "flush=True)\ntime.sleep(60)\n"


def test_a_port_another_process_reserved_is_not_handed_out_until_it_exits():
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == str(port)
        other = port_or_free(port)  # nobody listens on `port` yet, but it is the other harness's
        assert other != port
    finally:
        holder.kill()
        holder.wait()
    assert port_or_free(port) == port  # the reservation went with its holder
    release_port(port)


def test_within_a_process_a_reserved_port_is_handed_out_again_only_after_its_release():
    port = free_port()
    assert port_or_free(port) == port
    assert port_or_free(port) != port
    release_port(port)
    assert port_or_free(port) == port
    release_port(port)
