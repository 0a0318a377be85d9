"""Build hook: compile the isolation library (C) whenever the package is built or installed, editable included."""

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent


class BuildPyWithIsolation(build_py):
    """Run `make -C isolation` before collecting Python modules, so libvgpu.so ships with the package."""

    def run(self) -> None:
        if (HERE / "isolation" / "Makefile").exists():
            subprocess.run(["make", "-s", "-C", str(HERE / "isolation")], check=True)
        super().run()


setup(cmdclass={"build_py": BuildPyWithIsolation})
