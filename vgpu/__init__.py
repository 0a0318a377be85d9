"""Shared core of vgpu-sharing: resource model, request parsing and the annotation codecs.

Imported by the scheduler extender, the device plugin and the tools; imports nothing else of ours.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
