"""Stale nodes are rescored best first: `_best_first` yields every contender once, higher score, then lower rank,
then lower slot first, whether it sorts all of them at once or the head first (many contenders, many ties)."""

from __future__ import annotations

import numpy as np
import pytest

from vgpu.scheduler.placement import FULL_SORT, _best_first


@pytest.mark.parametrize("n", [1, 5, 32, 33, 200, FULL_SORT, FULL_SORT + 1, 3 * FULL_SORT])
@pytest.mark.parametrize("levels", [2, 50, 10_000])
def test_every_contender_comes_once_in_score_rank_slot_order(n, levels):
    rng = np.random.default_rng(n * 7 + levels)
    values = rng.integers(0, levels, n).astype(np.float64)  # few levels: long runs of equal scores
    ranks = rng.integers(0, max(n // 3, 1), n).astype(np.int64)  # ranks repeat too
    slots = rng.permutation(4 * n)[:n].astype(np.int64)
    parts = list(_best_first(values, ranks, slots, 32))
    assert parts and len(parts[0]) >= min(n, 32)  # at least the head comes first, in one list
    got = [item for part in parts for item in part]
    want = sorted(zip(values.tolist(), ranks.tolist(), slots.tolist()), key=lambda t: (-t[0], t[1], t[2]))
    assert got == want
