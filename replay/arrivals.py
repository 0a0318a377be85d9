"""The arrival sequence of one seed under the FGD protocol (USENIX ATC'23; docs/placement.md).

Per seed the pods (sorted by name) are shuffled, then inflated to 130 % of the cluster's GPU capacity by appending
uniform resamples (never deleted); every node gets a random rank that breaks score ties. Every policy replays the
same sequence and ranks for a seed, so results pair by seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vgpu.replay.trace import TracePod

__all__ = ["arrival_sequence"]


def arrival_sequence(
    pods: Sequence[TracePod], capacity_milli: int, n_nodes: int, seed: int, ratio: float = 1.3
) -> tuple[list[int], np.ndarray]:
    """The seed's arrivals (indices into `pods`) and node ranks, shared by every policy.

    Shuffle; then while the GPU request total T is below ratio * capacity, append a uniform resample, stopping at
    the first draw with T + its per-GPU milli over the target (the simulator's check); above the target, remove
    random pods until T <= target. Ranks are a random permutation of the nodes (lower wins ties).
    """
    rng = np.random.default_rng(seed)
    sequence = [int(i) for i in rng.permutation(len(pods))]
    total = sum(pods[i].gpu_total for i in sequence)
    target = ratio * capacity_milli
    if total < target:
        while True:
            j = int(rng.integers(len(pods)))
            if total + pods[j].gpu_milli > target:
                break
            sequence.append(j)
            total += pods[j].gpu_total
    else:
        while total > target and sequence:
            k = int(rng.integers(len(sequence)))
            total -= pods[sequence.pop(k)].gpu_total
    rank = rng.permutation(n_nodes).astype(np.int64)
    return sequence, rank
