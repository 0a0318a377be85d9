"""The release pipeline: .github/workflows/release.yml judged by actionlint (built from its Go module by
testbed/actionlint/build.sh), and the artifacts it publishes built here by the same script it runs
(deploy/release/build.py): a wheel per platform whose libvgpu.so is code for that platform (arm64 by the cross
compiler), tagged for it, and the chart packaged at the release's version with the released image as default."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from capabilities import missing, tool

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
BUILD = [sys.executable, str(ROOT / "deploy" / "release" / "build.py")]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def actionlint() -> str:
    if shutil.which("go") is None:
        missing("actionlint", "no Go toolchain here to build it (testbed/actionlint/build.sh)")
    done = subprocess.run(["bash", str(ROOT / "testbed" / "actionlint" / "build.sh")], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        missing("actionlint", f"testbed/actionlint/build.sh failed: {done.stderr.strip()[-300:]}")
    return done.stdout.strip()


def test_the_workflows_pass_actionlint(actionlint):
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert [f.name for f in files] == ["release.yml"]
    done = subprocess.run([actionlint, *map(str, files)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_refuses_a_broken_workflow(actionlint, tmp_path):
    broken = (WORKFLOWS / "release.yml").read_text().replace("runs-on: ubuntu-24.04\n    needs: image",
                                                            "runs-on: ubuntu-24.04\n    needs: imagee", 1)
    assert "needs: imagee" in broken
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "release.yml").write_text(broken)
    done = subprocess.run([actionlint, ".github/workflows/release.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "imagee" in done.stdout, done.stdout + done.stderr


def test_the_release_runs_on_a_version_tag_and_publishes_every_platform():
    flow = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    assert flow[True]["push"]["tags"] == ["v*"]   # YAML 1.1 reads the key `on` as true
    platforms = {m["platform"] for m in flow["jobs"]["wheels"]["strategy"]["matrix"]["include"]}
    assert platforms == {"linux/amd64", "linux/arm64"}
    push = next(s for s in flow["jobs"]["image"]["steps"] if s.get("uses", "").startswith("docker/build-push"))
    assert push["with"]["platforms"] == "linux/amd64,linux/arm64" and push["with"]["file"] == "deploy/Dockerfile"
    assert set(flow["jobs"]["release"]["needs"]) == {"wheels", "chart"}


def _elf_machine(data: bytes) -> int:
    assert data[:4] == b"\x7fELF"
    return int.from_bytes(data[18:20], "little")


def test_the_artifacts_build_a_wheel_per_platform_and_the_chart(tmp_path):
    tool("aarch64-linux-gnu-gcc", "Debian's gcc-aarch64-linux-gnu")
    done = subprocess.run([*BUILD, "--out", str(tmp_path), "--version", VERSION, "--no-build-isolation",
                           "--image-repository", "ghcr.io/example/vgpu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    built = sorted(p.name for p in tmp_path.iterdir())
    assert built == [f"vgpu-sharing-{VERSION}.tgz", f"vgpu_sharing-{VERSION}-py3-none-linux_aarch64.whl",
                     f"vgpu_sharing-{VERSION}-py3-none-linux_x86_64.whl"]
    for tag, machine in (("linux_x86_64", 62), ("linux_aarch64", 183)):
        with zipfile.ZipFile(tmp_path / f"vgpu_sharing-{VERSION}-py3-none-{tag}.whl") as wheel:
            names = wheel.namelist()
            assert _elf_machine(wheel.read("vgpu/isolation/build/libvgpu.so")) == machine
            assert f"Tag: py3-none-{tag}" in wheel.read(f"vgpu_sharing-{VERSION}.dist-info/WHEEL").decode()
        assert not [n for n in names if n.startswith(("vgpu/testbed/", "tests/"))]
    with tarfile.open(tmp_path / f"vgpu-sharing-{VERSION}.tgz") as chart:
        meta = yaml.safe_load(chart.extractfile("vgpu-sharing/Chart.yaml").read())
        values = yaml.safe_load(io.BytesIO(chart.extractfile("vgpu-sharing/values.yaml").read()))
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
    assert values["image"]["repository"] == "ghcr.io/example/vgpu"


def test_a_version_other_than_the_projects_is_refused_in_one_line(tmp_path):
    done = subprocess.run([*BUILD, "--out", str(tmp_path), "--version", "9.9.9", "--no-chart"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"release: version 9.9.9 is not pyproject.toml's {VERSION}: bump it, "
                                                "then tag"]
    assert not list(tmp_path.iterdir())
