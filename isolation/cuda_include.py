"""Where every C build of ours finds NVIDIA's cuda.h (CUDA 13.0): the one answer make's callers pass as CUDA_INCLUDE.

Called by the builds (`build.py`, the test bed's through it, and setup.py), the tests and benchmarks that compile
C against cuda.h. Standard library only: setup.py loads this file by path, before the package is installed.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

__all__ = ["cuda_include_dir"]

TOOLKIT = Path("/usr/local/cuda/include")
PACKAGE = "nvidia-cuda-runtime"  # PyPI's CUDA runtime: cuda.h and cudaTypedefs.h under nvidia/cu13/include


def cuda_include_dir() -> Path:
    """$CUDA_INCLUDE, else the CUDA toolkit's /usr/local/cuda/include when it holds cuda.h, else the include folder
    of the installed nvidia-cuda-runtime package; raises FileNotFoundError when there is none."""
    env = os.environ.get("CUDA_INCLUDE")
    if env:
        return Path(env)
    if (TOOLKIT / "cuda.h").is_file():
        return TOOLKIT
    try:
        files = metadata.distribution(PACKAGE).files or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "cuda.h":
            return Path(str(file.locate())).parent
    raise FileNotFoundError(f"cuda.h not found: set CUDA_INCLUDE, install the CUDA toolkit, or install {PACKAGE} "
                            "(the testbed extra has it)")
