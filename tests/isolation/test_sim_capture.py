"""Stream capture in the simulated driver, as cuda.h and the CUDA Programming Guide ("CUDA Graphs > Stream Capture")
document it: work submitted to a capturing stream is recorded into a graph instead of running; capture modes decide
which threads may make potentially unsafe calls; a prohibited call fails and invalidates the captures it conflicts
with; the legacy stream cannot be used while a blocking stream of its context captures; streams join a capture by
waiting on events recorded in it.  Driven directly (tests/isolation/csrc/sim_capture.c), without libvgpu.so."""
from __future__ import annotations

import pytest
from sim_helpers import (
    CAPTURED_EVENT,
    ILLEGAL_STATE,
    INVALID_VALUE,
    STREAM_CAPTURE_IMPLICIT,
    STREAM_CAPTURE_INVALIDATED,
    STREAM_CAPTURE_ISOLATION,
    STREAM_CAPTURE_MERGE,
    STREAM_CAPTURE_UNJOINED,
    STREAM_CAPTURE_UNMATCHED,
    STREAM_CAPTURE_UNSUPPORTED,
    STREAM_CAPTURE_WRONG_THREAD,
    MiB,
)

ACTIVE, INVALIDATED, NONE = "1", "2", "0"


@pytest.fixture
def capture(sim_programs, tmp_path):
    return lambda cmd: sim_programs.run("sim_capture", cmd, state=tmp_path / "sim.state")


@pytest.fixture(scope="module")
def modes(sim_programs, tmp_path_factory):
    """One run of every capture-mode trial (each begins, tries and ends its own capture)."""
    return sim_programs.run("sim_capture", "modes", state=tmp_path_factory.mktemp("modes") / "sim.state")


def test_captured_work_does_not_run_and_the_graph_runs_it_each_launch(capture):
    out = capture("basic")
    assert out["status_active"] == ACTIVE and out["status_after"] == NONE
    assert out["info_id_nonzero"] == "1" and out["info_v1_same_id"] == "1"
    assert out["info_deps_before"] == "0" and out["info_deps_after"] == "1"   # the next node depends on the last
    assert out["info_graph_nodes"] == "3" and out["graph_nodes"] == "3"
    assert out["node0_type"] == "0"   # CU_GRAPH_NODE_TYPE_KERNEL
    assert out["launches_during_capture"] == "0"
    assert out["launches_after_two_runs"] == "6"
    assert abs(float(out["busy_ms"]) - 90.0) < 1.0   # 2 x (20 + 20 + 5) ms on the engine
    assert out["invalidations"] == "0"


# "<call result>,<cuStreamEndCapture result>,<graph or null>"
REFUSED = f"{STREAM_CAPTURE_UNSUPPORTED},{STREAM_CAPTURE_INVALIDATED},null"
ALLOWED = "0,0,graph"


@pytest.mark.parametrize("trial,expected", [
    # a thread in GLOBAL mode may not allocate while another thread captures in GLOBAL mode ...
    ("global_other_thread_alloc", REFUSED),
    # ... unless it put itself in RELAXED or THREAD_LOCAL mode
    ("global_other_thread_relaxed_alloc", ALLOWED),
    ("global_other_thread_threadlocal_alloc", ALLOWED),
    # the capturing thread itself is prohibited unless the capture began RELAXED or the thread is RELAXED
    ("global_same_thread_alloc", REFUSED),
    ("threadlocal_other_thread_alloc", ALLOWED),
    ("threadlocal_same_thread_alloc", REFUSED),
    ("threadlocal_same_thread_relaxed_alloc", ALLOWED),
    ("relaxed_same_thread_alloc", ALLOWED),
    ("relaxed_other_thread_alloc", ALLOWED),
    # queries and synchronization are potentially unsafe calls too
    ("global_other_thread_event_query", REFUSED),
    ("global_other_thread_stream_sync", REFUSED),
    ("global_other_thread_event_sync", REFUSED),
    ("global_other_thread_stream_query", REFUSED),
    # synchronizing a context with a capturing stream conflicts with the capture in any mode
    ("global_same_thread_ctx_sync", REFUSED),
    ("relaxed_same_thread_ctx_sync", REFUSED),
    ("relaxed_same_thread_event_query", ALLOWED),
])
def test_capture_modes_decide_who_may_make_unsafe_calls(modes, trial, expected):
    assert modes[trial] == expected


def test_the_capturing_stream_is_never_queried_or_synchronized(modes):
    out = modes
    assert out["relaxed_query_capturing"] == (f"{STREAM_CAPTURE_UNSUPPORTED},{STREAM_CAPTURE_INVALIDATED},"
                                              f"{STREAM_CAPTURE_INVALIDATED},null")
    assert out["relaxed_sync_capturing"] == f"{STREAM_CAPTURE_UNSUPPORTED},{STREAM_CAPTURE_INVALIDATED}"
    assert out["invalidations"] == "9" and out["invalidations_end"] == "11"


def test_thread_exchange_stream_capture_mode_swaps(modes):
    out = modes
    assert out["exchange_old"] == "0" and out["exchange_back"] == "2"
    assert out["exchange_bad"] == str(INVALID_VALUE)


def test_an_event_recorded_in_a_capture_cannot_be_queried_even_relaxed(capture):
    out = capture("events")
    assert out["query_captured"] == str(CAPTURED_EVENT)
    assert out["status_after_query"] == INVALIDATED
    assert out["launch_after_invalid"] == str(STREAM_CAPTURE_INVALIDATED)
    assert out["end"] == str(STREAM_CAPTURE_INVALIDATED) and out["end_graph_null"] == "1"
    assert out["sync_captured_after_end"] == str(CAPTURED_EVENT)   # last recorded in a capture
    assert out["query_rerecorded"] == "0"
    assert out["invalidations"] == "1"


def test_the_legacy_stream_is_unusable_while_a_blocking_stream_captures(capture):
    out = capture("legacy")
    assert out["is_capturing_legacy"] == str(STREAM_CAPTURE_IMPLICIT)
    assert out["is_capturing_legacy_handle"] == str(STREAM_CAPTURE_IMPLICIT)
    assert out["status_after_is_capturing"] == ACTIVE   # the query does not invalidate
    assert out["launch_legacy"] == str(STREAM_CAPTURE_IMPLICIT)
    assert out["status_after_launch"] == INVALIDATED
    assert out["end"] == str(STREAM_CAPTURE_INVALIDATED)
    assert out["memcpy_sync"] == str(STREAM_CAPTURE_IMPLICIT) and out["end_memcpy"] == str(STREAM_CAPTURE_INVALIDATED)
    assert out["sync_legacy"] == str(STREAM_CAPTURE_IMPLICIT) and out["end_sync"] == str(STREAM_CAPTURE_INVALIDATED)
    # a non-blocking stream's capture leaves the legacy stream alone
    assert out["launch_legacy_nonblocking"] == "0" and out["end_nonblocking"] == "0"
    assert out["begin_on_legacy"] == str(STREAM_CAPTURE_UNSUPPORTED)
    assert out["invalidations"] == "3"


def test_streams_fork_and_join_through_events(capture):
    out = capture("forkjoin")
    assert out["s2_before_wait"] == NONE and out["s2_after_wait"] == ACTIVE and out["same_capture"] == "1"
    assert out["end_from_forked"] == str(STREAM_CAPTURE_UNMATCHED)
    assert out["end_joined"] == str(STREAM_CAPTURE_INVALIDATED)
    assert out["end_joined_again"] == "0" and out["joined_nodes"] == "4" and out["s2_after_end"] == NONE
    assert out["launches_during"] == "0"
    assert abs(float(out["joined_busy_ms"]) - 10.0) < 1.0
    assert out["end_unjoined"] == str(STREAM_CAPTURE_UNJOINED) and out["unjoined_graph_null"] == "1"
    assert out["s2_after_unjoined"] == NONE
    assert out["wait_merge"] == str(STREAM_CAPTURE_MERGE)
    assert out["end_merge_s1"] == out["end_merge_s2"] == str(STREAM_CAPTURE_INVALIDATED)
    assert out["wait_outside"] == str(STREAM_CAPTURE_ISOLATION)
    assert out["end_outside"] == str(STREAM_CAPTURE_INVALIDATED)
    assert out["wait_outside_external"] == "0" and out["end_outside_external"] == "0" and out["external_nodes"] == "1"
    assert out["wait_external_uncaptured"] == str(INVALID_VALUE)
    assert out["begin_twice"] == str(ILLEGAL_STATE) and out["end_not_capturing"] == str(ILLEGAL_STATE)


def test_only_relaxed_captures_end_in_another_thread_and_the_old_symbol_is_global(capture):
    out = capture("threads")
    assert out["end_other_thread_threadlocal"] == str(STREAM_CAPTURE_WRONG_THREAD) and out["still_active"] == ACTIVE
    assert out["end_other_thread_relaxed"] == "0"
    assert out["old_begin_status"] == ACTIVE
    assert out["old_begin_other_thread_alloc"] == str(STREAM_CAPTURE_UNSUPPORTED)
    assert out["old_begin_end"] == str(STREAM_CAPTURE_INVALIDATED)


def test_the_per_thread_default_stream_captures(capture):
    out = capture("ptsz")
    assert out["ptsz_status"] == ACTIVE and out["per_thread_handle_status"] == ACTIVE
    assert out["legacy_while_per_thread_captures"] == str(STREAM_CAPTURE_IMPLICIT)   # it is a blocking stream
    assert out["end_ptsz"] == str(STREAM_CAPTURE_INVALIDATED)
    assert out["ptsz_nodes"] == "2" and out["launches_during"] == "0"


def test_graph_launches_event_records_and_allocations_inside_a_capture(capture):
    out = capture("nested")
    assert out["alloc_in_capture_used_delta"] == "0"   # an alloc node: no memory yet
    assert out["outer_nodes"] == "6"   # 2 kernels of the launched graph, record, alloc, kernel, free
    assert out["launches_during"] == "0"
    assert out["record_external_outside"] == str(INVALID_VALUE)
    assert out["used_after_instantiate"] == "0"
    assert out["used_after_launch"] == str(64 * MiB)   # taken at launch, into the graph pool
    assert out["mark_query"] == "0" and out["launches_after"] == "3"
    assert out["used_after_relaunch"] == str(64 * MiB)   # the pool's memory is reused
    assert out["used_after_trim"] == "0"   # cuDeviceGraphMemTrim gives it back
    assert out["unfreed_used"] == str(32 * MiB)
    assert out["relaunch_unfreed"] == str(INVALID_VALUE)
    assert out["after_free_used"] == str(32 * MiB) and out["after_free_trim_used"] == "0"
    assert out["free_async_plain_in_capture"] == str(INVALID_VALUE)
    assert out["end_after_bad_free"] == str(STREAM_CAPTURE_INVALIDATED)
    assert out["to_graph_same"] == "1" and out["to_graph_nodes"] == "2"


def test_dependency_updates_instantiation_parameters_and_a_destroyed_capturing_stream(capture):
    out = capture("misc")
    assert out["update_not_capturing"] == str(ILLEGAL_STATE)
    assert out["deps_after_set_empty"] == "0" and out["deps_after_add"] == "1,1"
    assert out["update_foreign_node"] == str(INVALID_VALUE)
    assert out["misc_nodes"] == "3"
    assert out["with_params_result"] == "0"   # CUDA_GRAPH_INSTANTIATE_SUCCESS
    assert out["uploaded_used"] == str(6 * MiB)   # CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD maps the allocation now
    assert out["event_before_launch"] == "0" and out["event_after_launch"] == "0"
    assert out["reset_high"] == "0" and out["set_high_nonzero"] == str(INVALID_VALUE)
    assert out["alloc_after_destroyed_capture"] == "0"   # the capture ended with its stream
    assert out["destroy_invalidations"] == "1"
