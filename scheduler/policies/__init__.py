"""Node scoring policies: how the extender ranks the nodes a pod fits on.

Every policy is a `NodePolicy` registered by name in `NODE_POLICIES`; `make_policy(name)` builds one.
`DEFAULT_NODE_POLICY` is the one `vgpu scheduler` uses when none is given: `fragaware`, our fragmentation-aware
policy (`vgpu replay`'s "ours"), which leaves less GPU capacity unallocated than FGD on every openb trace
(docs/placement.md). Volcano's `binpack` remains available and is the cheaper one to run.
"""

from scheduler.policies.base import NODE_POLICIES, NodeContext, NodePolicy, PodContext, make_policy, register
from scheduler.policies import classic as _classic  # noqa: F401  (registers binpack and spread)
from scheduler.policies import baselines as _baselines  # noqa: F401  (random, bestfit, dotprod, packing)
from scheduler.policies import frag as _frag  # noqa: F401  (fgd, fragaware)

DEFAULT_NODE_POLICY = "fragaware"

__all__ = ["NodePolicy", "NodeContext", "PodContext", "NODE_POLICIES", "DEFAULT_NODE_POLICY", "make_policy", "register"]
