"""`vgpu whatif` and `vgpu consolidate`: the live cluster replayed under each placement policy, and the moves that
free whole GPUs for the pods waiting for them.

Depends on vgpu.scheduler (its ledger, fit and placement loop) and vgpu.kube; nothing depends on it but the CLI.
"""
