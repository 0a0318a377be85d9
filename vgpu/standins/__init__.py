"""TEST INFRASTRUCTURE: stand-ins for the cluster parts we do not ship (API server, kubelet, kube-scheduler).

Nothing in here is used by the scheduler extender or the device plugin at run time. Tests and `vgpu demo` start
these so that our real components can talk to real protocol peers without a cluster.
"""

__all__: list[str] = []
