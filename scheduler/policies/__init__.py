"""Node scoring policies: how the extender ranks the nodes a pod fits on.

Every policy is a `NodePolicy` registered by name in `NODE_POLICIES`; `make_policy(name)` builds one.
"""

from scheduler.policies.base import NODE_POLICIES, NodePolicy, make_policy, register
from scheduler.policies import classic as _classic  # noqa: F401  (registers binpack and spread)

__all__ = ["NodePolicy", "NODE_POLICIES", "make_policy", "register"]
