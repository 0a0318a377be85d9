"""Packaging: the top-level folders install as one import package, `vgpu`, and the C libraries are built.

`vgpu/` is the core; `scheduler/`, `deviceplugin/`, `draplugin/`, `isolation/`, `proto/`, `replay/`, `webhook/`
and `testbed/` become `vgpu.scheduler`, `vgpu.deviceplugin`, ... (setuptools' package_dir). The test bed (stand-ins,
the simulated GPU, `vgpu demo`) is packaged only when its folder is present: the production image's build context
leaves it out, and with it the `demo` subcommand it registers under the `vgpu.subcommands` entry-point group.

Building (also for editable installs) first runs `make` in isolation/ (libvgpu.so) and, with the test bed, in
testbed/ (the simulated libcuda.so.1 and libnvidia-ml.so.1); a failed C build fails the install. cuda.h comes from
where isolation/cuda_include.py finds it: in pip's isolated build environment, the nvidia-cuda-runtime package that
pyproject.toml's [build-system] requires.
"""

import importlib.util
import subprocess
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.bdist_wheel import bdist_wheel, get_platform
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent

# import package -> folder, in dependency order
FOLDERS = {
    "vgpu": "vgpu",
    "vgpu.proto": "proto",
    "vgpu.scheduler": "scheduler",
    "vgpu.node": "node",
    "vgpu.deviceplugin": "deviceplugin",
    "vgpu.draplugin": "draplugin",
    "vgpu.isolation": "isolation",
    "vgpu.replay": "replay",
    "vgpu.planning": "planning",
    "vgpu.webhook": "webhook",
    "vgpu.testbed": "testbed",
}
# folders with a Makefile whose outputs ship with the package
C_FOLDERS = ("isolation", "testbed")
PACKAGE_DATA = {
    "vgpu.isolation": ["Makefile", "src/*.c", "src/*.h", "build/libvgpu.so"],
    "vgpu.node": ["backends/cards.json"],
    "vgpu.proto": ["*/*/*.proto"],
    "vgpu.testbed": ["Makefile", "simgpu/*.c", "simgpu/*.h", "build/simgpu/*.so.1"],
}


def _present() -> dict[str, str]:
    return {name: folder for name, folder in FOLDERS.items() if (HERE / folder / "__init__.py").exists()}


def _packages(present: dict[str, str]) -> list[str]:
    names = []
    for name, folder in present.items():
        names.append(name)
        names += [f"{name}.{sub}" for sub in find_packages(str(HERE / folder))]
    return sorted(names)


def _cuda_include_dir() -> Path:
    """cuda.h's folder, from isolation/cuda_include.py (loaded by path: the package is not installed yet)."""
    spec = importlib.util.spec_from_file_location("cuda_include", HERE / "isolation" / "cuda_include.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cuda_include_dir()


class BuildPyWithC(build_py):
    """Run `make` in every present C folder before collecting modules and data, so the libraries ship."""

    def run(self) -> None:
        include = _cuda_include_dir()
        for folder in C_FOLDERS:
            if (HERE / folder / "Makefile").exists():
                subprocess.run(["make", "-s", "-C", str(HERE / folder), f"CUDA_INCLUDE={include}"], check=True)
        super().run()


class PlatformWheel(bdist_wheel):
    """The wheel holds libvgpu.so built on this machine: tag it for this platform (`py3-none-linux_x86_64`), never
    as pure Python that would install anywhere (`--plat-name` names another, for a cross build)."""

    def get_tag(self) -> tuple[str, str, str]:
        platform = self.plat_name if self.plat_name_supplied else get_platform(None)
        return "py3", "none", platform.replace("-", "_").replace(".", "_")


PRESENT = _present()
ENTRY_POINTS = {"console_scripts": ["vgpu = vgpu.cli:main"]}
if "vgpu.testbed" in PRESENT:
    ENTRY_POINTS["vgpu.subcommands"] = ["demo = vgpu.testbed.cli:register"]

setup(
    package_dir=PRESENT,
    packages=_packages(PRESENT),
    package_data={name: files for name, files in PACKAGE_DATA.items() if name in PRESENT},
    entry_points=ENTRY_POINTS,
    cmdclass={"build_py": BuildPyWithC, "bdist_wheel": PlatformWheel},
)
