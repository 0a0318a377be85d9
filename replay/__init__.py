"""`vgpu replay`: GPU-cluster traces replayed through the scheduler's own placement code, and their reports.

Depends on vgpu.scheduler, never the reverse.
"""
