"""Stream capture under limits (what torch.cuda.graph and torch.compile's reduce-overhead mode do): the library makes
no call a capture forbids, from any thread, launches into a capture are neither gated nor timed, and the captured
work is charged when the graph is launched.  The simulated driver models capture as cuda.h documents it (a prohibited
call invalidates the capture; docs/testbed-fidelity.md)."""
from __future__ import annotations

import pytest

LIMIT = 30
GRAPH_NS = 20 * 200_000          # the captured graph: 20 kernels of 200 us


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_capture_beside_limited_launches_stays_valid_and_replays_at_the_limit(sim, probe_api, mode):
    replays = 150
    out = sim.run("capture", mode, "20", str(replays), program=probe_api, timeout=120,
                  CUDA_DEVICE_MEMORY_LIMIT="4g", CUDA_DEVICE_SM_LIMIT=str(LIMIT), GPU_CORE_UTILIZATION_POLICY="force")
    assert out["_rc"] == "0", out
    assert out["end"] == "0", out                 # cuStreamEndCapture: the capture was never invalidated
    assert out["invalidations"] == "0", out
    assert int(out["other_launches"]) > 0
    share = replays * GRAPH_NS / 1e9 / float(out["replay_seconds"]) * 100
    assert abs(share - LIMIT) <= 3, share         # replays are charged what the graph's kernels took
