"""Events of the simulated driver belong to the context current at their creation and die with it (cuda.h
cuEventCreate "for the current context"; cuCtxDestroy "Destroys and cleans up all resources associated with the
context", CUevent among them; the last cuDevicePrimaryCtxRelease resets the primary context; cuDevicePrimaryCtxReset
"destroys and cleans up all resources").  A later use of such an event is refused with CUDA_ERROR_INVALID_HANDLE
(CUDA_ERROR_INVALID_VALUE for the graph node calls, the only code of theirs that fits) without touching freed memory,
and counted by simgpu_dead_event_uses(), so a library's tests can assert it never does so.  Driven directly
(tests/isolation/csrc/sim_events.c), without libvgpu.so; see docs/testbed-fidelity.md "Events and their context"."""
from __future__ import annotations

import pytest
from sim_helpers import INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, SUCCESS

CONTEXT_IS_DESTROYED = 709   # cuda.h CUresult

# every event entry point sim_events.c's use_all() calls, and what each must answer for a dead event
EVENT_CALLS = ["record", "record_ptsz", "record_flags", "record_flags_ptsz", "query", "sync", "elapsed_start",
               "elapsed_end", "elapsed_v2", "wait", "wait_ptsz"]
GRAPH_CALLS = ["graph_record_node", "graph_wait_node"]


@pytest.fixture
def events(sim_programs, tmp_path):
    return lambda *args, **kw: sim_programs.run("sim_events", *args, state=tmp_path / "sim.state", **kw)


def assert_refused(out: dict[str, str], prefix: str) -> None:
    for call in EVENT_CALLS:
        assert out[f"{prefix}_{call}"] == str(INVALID_HANDLE), (call, out)
    for call in GRAPH_CALLS:
        assert out[f"{prefix}_{call}"] == str(INVALID_VALUE), (call, out)


def test_event_of_a_destroyed_context_is_refused_and_counted(events):
    out = events("created")
    assert out["_rc"] == "0", out
    assert out["before"] == "0" and out["after_destroy"] == "0"   # destroying the context is no use of its events
    assert out["popped_to_primary"] == "1"
    assert_refused(out, "dead")
    assert_refused(out, "dead_unrecorded")   # recorded or not, it died with the context
    # cuEventDestroy of it is refused too (the driver freed it with the context), and stays refused
    assert out["destroy"] == out["destroy_again"] == str(INVALID_HANDLE)
    assert out["calls"] == str(2 * (len(EVENT_CALLS) + len(GRAPH_CALLS)) + 2)
    assert out["counted"] == out["calls"]   # one count per call that used a dead event


def test_events_of_a_live_context_are_unaffected(events):
    out = events("created")
    assert out["primary_live_ok"] == "1"   # another context's events: recorded, waited, timed, destroyed
    assert out["live_uses_counted"] == "0"


def test_a_new_context_at_the_same_address_does_not_revive_old_events(events):
    out = events("reuse")
    assert out["_rc"] == "0", out
    assert out["same_address"] == "1"   # the allocator hands the freed context's memory to the next context
    assert out["fresh_is_new_handle"] == "1"   # a dead event's handle is never handed out again
    assert_refused(out, "old")
    assert out["old_destroy"] == str(INVALID_HANDLE)
    assert out["counted"] == out["calls"] == str(len(EVENT_CALLS) + len(GRAPH_CALLS) + 1)
    assert out["fresh_live_ok"] == "1"   # the new context's event works
    # the second context is destroyed in its turn and a third takes the address: both generations stay dead
    assert out["fresh_query"] == out["old_query"] == str(INVALID_HANDLE)
    assert out["counted_second"] == "2"


@pytest.mark.parametrize("name", ["v2", "v1"])   # cuDevicePrimaryCtxRelease_v2 and the CUDA 7.0 symbol
def test_primary_context_events_die_with_its_last_release(events, name):
    out = events("release", name)
    assert out["_rc"] == "0", out
    assert out["still_retained_live_ok"] == "1"   # one release of two: the context and its events live
    assert out["active"] == "0"
    assert out["same_address"] == "1"   # the primary context retained anew is at the same address
    assert_refused(out, "dead")
    assert out["destroy"] == str(INVALID_HANDLE)
    assert out["counted"] == out["calls"] == str(len(EVENT_CALLS) + len(GRAPH_CALLS) + 1)
    assert out["new_primary_live_ok"] == "1"


@pytest.mark.parametrize("name", ["v2", "v1"])   # cuDevicePrimaryCtxReset_v2 and the CUDA 7.0 symbol
def test_primary_context_reset_kills_its_events_and_no_others(events, name):
    out = events("reset", name)
    assert out["_rc"] == "0", out
    assert out["still_active"] == "1"   # "Resetting the primary context does not release it"
    assert_refused(out, "dead")
    assert out["destroy"] == str(INVALID_HANDLE)
    assert out["counted"] == out["calls"] == str(len(EVENT_CALLS) + len(GRAPH_CALLS) + 1)
    assert out["after_reset_live_ok"] == "1"   # events created after the reset work
    assert out["created_ctx_live_ok"] == "1"   # a created context on the same device is not reset


def test_green_context_events_die_with_it(events):
    out = events("green")
    assert out["_rc"] == "0", out
    assert out["query"] == out["destroy"] == str(INVALID_HANDLE)
    assert out["counted"] == "2"
    assert out["primary_live_ok"] == "1"   # the primary context it retained keeps its own events


def test_captured_and_graph_events_die_cleanly(events):
    out = events("graph")
    assert out["_rc"] == "0", out
    # an event last recorded in a capture: dead first (no CUDA_ERROR_CAPTURED_EVENT for a dead handle)
    assert out["captured_query"] == out["captured_wait"] == out["captured_destroy"] == str(INVALID_HANDLE)
    assert out["counted_captured"] == "3"
    # a graph whose event record node names a dead event still launches, records nothing, and is counted
    assert out["launch"] == str(SUCCESS) and out["counted_launch"] == "1"
    assert out["launch_without_events"] == str(SUCCESS) and out["counted_clean_launch"] == "0"


def test_a_thread_whose_context_was_destroyed_makes_no_events(events):
    out = events("stale")
    assert out["_rc"] == "0", out
    # cuCtxDestroy: "attempting to access ctx from those threads will result in ... CUDA_ERROR_CONTEXT_IS_DESTROYED"
    assert out["create"] == str(CONTEXT_IS_DESTROYED)
    assert out["record_old"] == str(INVALID_HANDLE) and out["counted"] == "1"   # its event died with it
    assert out["destroy_again"] == str(INVALID_CONTEXT)   # a destroyed context is not destroyed twice
    # a new context takes the address: the stale handle now names it, as a driver's reused handle would
    assert out["same_address"] == "1" and out["create_after_reuse"] == str(SUCCESS)
