"""The kube-scheduler extender: fit, scoring policies, the usage ledger, the HTTP server and trace replay."""

__all__: list[str] = []
