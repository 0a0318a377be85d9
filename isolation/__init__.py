"""Isolation: libvgpu.so (hard GPU memory and compute limits), the simulated GPU, the region reader, `vgpu run`."""
from vgpu.isolation.build import Paths, ensure_built

__all__ = ["Paths", "ensure_built"]
