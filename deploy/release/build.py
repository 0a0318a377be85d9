"""Builds a release's artifacts into one folder: the production wheel (the image's sources, no test bed) for each
platform, its libvgpu.so compiled for that platform (natively, or by the cross compiler `<arch>-linux-gnu-gcc`), and
the Helm chart packaged at the release's version with the released image as its default. The release workflow
(.github/workflows/release.yml) runs it on a tag; tests/deploy/test_release.py runs it in CI.

    python deploy/release/build.py --out dist [--version 0.1.0] [--platform linux/amd64 --platform linux/arm64]
                                   [--image-repository ghcr.io/OWNER/vgpu] [--no-build-isolation]
                                   [--no-chart | --no-wheels]

A version that differs from pyproject.toml's is refused (bump it, then tag). Errors are one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vgpu-sharing"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
LIBRARY = "vgpu/isolation/build/libvgpu.so"
DEFAULT_IMAGE = "vgpu-sharing/vgpu"


class ReleaseError(Exception):
    """What stops the build, in one line."""


# platform -> (machine name as uname says it, wheel platform tag, ELF e_machine of its code)
PLATFORMS = {
    "linux/amd64": ("x86_64", "linux_x86_64", 62),
    "linux/arm64": ("aarch64", "linux_aarch64", 183),
}


def image_sources(dockerfile: Path = DOCKERFILE) -> list[str]:
    """The paths the image's build stage copies (its `COPY` lines without `--from`): the production wheel's sources."""
    sources: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += words[1:-1]
    return sources


def project_version() -> str:
    """pyproject.toml's version."""
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def _compiler(target: str) -> dict[str, str]:
    """The environment that compiles C for `target` here: none for this machine's own, CC for a cross compiler."""
    machine = PLATFORMS[target][0]
    if machine == platform.machine():
        return {}
    cc = f"{machine}-linux-gnu-gcc"
    if shutil.which(cc) is None:
        raise ReleaseError(f"{target}: no {cc} on PATH to cross-compile libvgpu.so (Debian: gcc-{machine}-linux-gnu)")
    return {"CC": cc}


def elf_machine(data: bytes) -> int:
    """The e_machine of an ELF file's header (little-endian)."""
    if data[:4] != b"\x7fELF":
        raise ReleaseError("libvgpu.so in the wheel is not an ELF file")
    return int.from_bytes(data[18:20], "little")


def build_wheel(target: str, out: Path, isolated: bool = True) -> Path:
    """The production wheel for `target`, built from a copy of the image's sources; checked to hold a libvgpu.so
    for that platform."""
    machine, tag, e_machine = PLATFORMS[target]
    env = dict(os.environ, **_compiler(target))
    with tempfile.TemporaryDirectory(prefix=f"vgpu-release-{machine}-") as tmp:
        source = Path(tmp) / "src"
        for rel in image_sources():
            src, dst = ROOT / rel, source / rel
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("build", "__pycache__", "*.so", "*.o"))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        wheels = Path(tmp) / "wheels"
        command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
                   f"--config-settings=--build-option=--plat-name={tag}", str(source)]
        if not isolated:
            command.insert(5, "--no-build-isolation")
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise ReleaseError(f"{target}: pip wheel failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        (wheel,) = wheels.glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            found = elf_machine(archive.read(LIBRARY))
        if found != e_machine:
            raise ReleaseError(f"{target}: libvgpu.so in {wheel.name} is for ELF machine {found}, not {e_machine}")
        if not wheel.name.endswith(f"-py3-none-{tag}.whl"):
            raise ReleaseError(f"{target}: {wheel.name} is not tagged py3-none-{tag}")
        out.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheel, out / wheel.name))


def package_chart(out: Path, version: str, image_repository: str | None = None) -> Path:
    """The chart linted and packaged at `version` (chart and app version), its default image `image_repository`."""
    import helm_python as helm  # the Helm engine, from the test extras (helm-python-sdk)

    with tempfile.TemporaryDirectory(prefix="vgpu-release-chart-") as tmp:
        chart = Path(tmp) / CHART.name
        shutil.copytree(CHART, chart)
        if image_repository:
            values = chart / "values.yaml"
            text, count = re.subn(rf"(?m)^(  repository: ){re.escape(DEFAULT_IMAGE)}$", rf"\g<1>{image_repository}",
                                  values.read_text())
            if count != 1:
                raise ReleaseError(f"values.yaml: no single `repository: {DEFAULT_IMAGE}` line to point at the image")
            values.write_text(text)
        report = helm.lint(str(chart), strict=True, quiet=True)
        if report.get("errors"):
            raise ReleaseError(f"helm lint: {report['errors'][0]}")
        out.mkdir(parents=True, exist_ok=True)
        return Path(helm.package(str(chart), destination=str(out), version=version, app_version=version))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the release artifacts: wheels per platform and the chart.")
    parser.add_argument("--out", type=Path, required=True, help="folder the artifacts are written to")
    parser.add_argument("--version", help="the release's version (default: pyproject.toml's; must equal it)")
    parser.add_argument("--platform", action="append", choices=sorted(PLATFORMS), dest="platforms",
                        help="a platform to build a wheel for (repeatable; default: all)")
    parser.add_argument("--image-repository", help="the chart's default image (default: unchanged)")
    parser.add_argument("--no-build-isolation", action="store_true",
                        help="build with this environment's setuptools and nvidia-cuda-runtime (offline)")
    parser.add_argument("--no-chart", action="store_true", help="build the wheels only")
    parser.add_argument("--no-wheels", action="store_true", help="package the chart only")
    args = parser.parse_args(argv)
    try:
        version = args.version or project_version()
        if version != project_version():
            raise ReleaseError(f"version {version} is not pyproject.toml's {project_version()}: bump it, then tag")
        for target in [] if args.no_wheels else args.platforms or sorted(PLATFORMS):
            print(build_wheel(target, args.out, isolated=not args.no_build_isolation))
        if not args.no_chart:
            print(package_chart(args.out, version, args.image_repository))
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
