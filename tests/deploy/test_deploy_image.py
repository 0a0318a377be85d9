"""The wheels we build: one import package of ours, and a production image without the test bed.

No Docker engine runs here, so the image's content is reproduced from deploy/Dockerfile itself: the build-stage
COPY lines (filtered by deploy/Dockerfile.dockerignore) are copied into an empty build context and the wheel is
built from it with pip, as the Dockerfile's `pip wheel` does; the runtime stage installs exactly that wheel.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
IGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            tail = pattern[3:]
            if any(fnmatch.fnmatch("/".join(parts[i:i + tail.count("/") + 1]), tail) for i in range(len(parts))):
                return True
        elif any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            return True
    return False


def _build_stage_sources() -> list[str]:
    """Sources of the COPY lines of the first stage (not --from another stage)."""
    sources: list[str] = []
    stage = 0
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "FROM":
            stage += 1
        elif words[0].upper() == "COPY" and stage == 1 and not any(w.startswith("--from") for w in words):
            sources += words[1:-1]
    return sources


def _wheel(source: Path, out: Path) -> zipfile.ZipFile:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=600)
    (wheel,) = out.glob("vgpu_sharing-*.whl")
    return zipfile.ZipFile(wheel)


def _top_level(names: list[str]) -> set[str]:
    return {n.split("/", 1)[0] for n in names if ".dist-info/" not in n}


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    patterns = [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    context = tmp_path_factory.mktemp("context")
    for source in _build_stage_sources():
        origin = ROOT / source
        assert origin.exists(), f"Dockerfile copies {source}, which is not in the repository"
        if origin.is_file():
            shutil.copy2(origin, context / source)
            continue
        for path in origin.rglob("*"):
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and not _ignored(rel, patterns):
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, context / rel)
    return _wheel(context, tmp_path_factory.mktemp("image-wheel"))


def test_the_dockerfile_copies_every_shipped_folder_and_not_the_test_bed():
    sources = _build_stage_sources()
    shipped = {"vgpu", "scheduler", "node", "deviceplugin", "draplugin", "isolation", "proto", "replay", "webhook",
               "setup.py"}
    assert shipped <= set(sources), shipped - set(sources)
    assert "testbed" not in sources and "tests" not in sources


def test_the_image_holds_one_import_package_without_the_test_bed_or_the_simulated_driver(image_wheel):
    names = image_wheel.namelist()
    assert _top_level(names) == {"vgpu"}
    assert not [n for n in names if n.startswith("vgpu/testbed/")]
    assert not [n for n in names if "simgpu" in n or n.endswith(("libcuda.so.1", "libnvidia-ml.so.1"))]
    assert "vgpu/isolation/build/libvgpu.so" in names
    assert "vgpu/node/backends/cards.json" in names   # the simulated backend's card table
    # it holds a native library: tagged for the platform it was built on, never py3-none-any
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert Path(image_wheel.filename).name.endswith(f"-py3-none-{platform}.whl"), image_wheel.filename
    entry_points = image_wheel.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "vgpu = vgpu.cli:main" in entry_points
    assert "vgpu.subcommands" not in entry_points  # no `vgpu demo` in production
    # every package the `vgpu` command imports at start is in the image (the DRA plugin was not, so `vgpu` failed)
    tree = ast.parse((ROOT / "vgpu" / "cli.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    for module in sorted(m for m in imported if m.startswith("vgpu.")):
        path = module.replace(".", "/")
        assert f"{path}/__init__.py" in names or f"{path}.py" in names, module


def test_every_subcommand_runs_from_the_image_wheel_alone(image_wheel, tmp_path):
    """The image's wheel installed by itself (its dependencies from this environment, our own editable checkout out of
    sight: no site hooks, the wheel first on the path) answers `--help` for each subcommand, and `demo` is not one."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(image_wheel.filename)], check=True, capture_output=True, timeout=300)
    dependencies = [p for p in sys.path if p.endswith("site-packages")]
    env = {"PYTHONPATH": ":".join([str(target), *dependencies]), "PATH": "/usr/bin:/bin"}

    def vgpu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-S", "-m", "vgpu.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    where = subprocess.run([sys.executable, "-S", "-c", "import vgpu; print(vgpu.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(target)), where.stdout + where.stderr
    top = vgpu("--help")
    assert top.returncode == 0, top.stderr
    subcommands = sorted(set(re.findall(r"^    (\w[\w-]*) ", top.stdout, re.M)))
    expected = {"scheduler", "inspect", "device-plugin", "dra-plugin", "run", "doctor", "replay", "webhook"}
    assert expected <= set(subcommands) and "demo" not in subcommands, subcommands
    for name in subcommands:
        answer = vgpu(name, "--help")
        assert answer.returncode == 0 and answer.stdout.startswith(f"usage: vgpu {name}"), (name, answer.stderr)


def test_the_full_wheel_holds_exactly_one_top_level_import_package(tmp_path):
    checkout = tmp_path / "checkout"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for rel in tracked.splitlines():
        if (ROOT / rel).is_file():
            (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, checkout / rel)
    with _wheel(checkout, tmp_path / "wheel") as wheel:
        names = wheel.namelist()
    assert _top_level(names) == {"vgpu"}
    packages = ("scheduler", "node", "deviceplugin", "draplugin", "isolation", "proto", "replay", "testbed", "kube")
    for package in packages:
        assert f"vgpu/{package}/__init__.py" in names
    assert "vgpu/testbed/build/simgpu/libcuda.so.1" in names
