"""Node scoring policies: how the extender ranks the nodes a pod fits on.

Every policy is a `NodePolicy` registered by name in `NODE_POLICIES`; `make_policy(name)` builds one.
`DEFAULT_NODE_POLICY` is the one `vgpu scheduler` uses when none is given: `fragaware`, our fragmentation-aware
policy (`vgpu replay`'s "ours"), which leaves less GPU capacity unallocated than FGD on the openb traces and most
workloads derived from them (docs/placement.md names where it does not). Volcano's `binpack` remains available and
is the cheaper one to run.
"""

from vgpu.scheduler.policies import baselines as _baselines  # noqa: F401  (random, bestfit, dotprod, packing)
from vgpu.scheduler.policies import classic as _classic  # noqa: F401  (registers binpack and spread)
from vgpu.scheduler.policies import frag as _frag  # noqa: F401  (fgd, fragaware)
from vgpu.scheduler.policies.base import NODE_POLICIES, NodeContext, NodePolicy, PodContext, make_policy, register

DEFAULT_NODE_POLICY = "fragaware"

__all__ = ["DEFAULT_NODE_POLICY", "NODE_POLICIES", "NodeContext", "NodePolicy", "PodContext", "make_policy", "register"]
