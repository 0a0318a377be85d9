"""Regenerate the Python gRPC code of proto/ with grpcio-tools (pinned equal to grpcio).

Run `python proto/generate.py` after editing a .proto file; `--check` only reports whether the committed files
are current (exit 1 if not). tests/proto runs the check. The protos are staged as `vgpu/proto/<api>/<version>/`
in a temporary include root, so the generated modules import each other as `vgpu.proto.<api>.<version>.api_pb2`,
the path this folder is installed under; the proto packages (`v1beta1`, `v1`, `v1alpha1`) and so the gRPC method
paths are kubelet's.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = (
    "proto/deviceplugin/v1beta1/api.proto",
    "proto/podresources/v1/api.proto",
    "proto/pluginregistration/v1/api.proto",
    "proto/dra/v1/api.proto",
    "proto/dra/v1beta1/api.proto",
    "proto/drahealth/v1/api.proto",
    "proto/drahealth/v1alpha1/api.proto",
)
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_files(proto: str) -> list[str]:
    """Paths (relative to the repository root) of the files generated from one .proto."""
    stem = proto[: -len(".proto")]
    return [stem + suffix for suffix in SUFFIXES]


INSTALLED_AS = "vgpu/"  # the import path of this folder is vgpu.proto


def generate(out_dir: Path) -> None:
    """Compile every proto into `out_dir` (same relative layout as the repository)."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as staging, tempfile.TemporaryDirectory() as raw:
        for proto in PROTOS:
            staged = Path(staging) / INSTALLED_AS / proto
            staged.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / proto, staged)
        for proto in PROTOS:
            args = [
                "grpc_tools.protoc",
                f"-I{staging}",
                f"-I{well_known}",
                f"--python_out={raw}",
                f"--pyi_out={raw}",
                f"--grpc_python_out={raw}",
                str(Path(staging) / INSTALLED_AS / proto),
            ]
            if protoc.main(args) != 0:
                raise SystemExit(f"protoc failed on {proto}")
        for proto in PROTOS:
            for rel in generated_files(proto):
                target = out_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(raw) / INSTALLED_AS / rel, target)


def stale_files() -> list[str]:
    """Generated files that differ from a fresh generation (empty when everything is current)."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for proto in PROTOS:
            for rel in generated_files(proto):
                fresh, committed = Path(tmp) / rel, ROOT / rel
                if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                    stale.append(rel)
        return stale


def main(argv: list[str] | None = None) -> int:
    """Regenerate (default) or check the generated code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for rel in stale:
            print(f"stale: {rel}", file=sys.stderr)
        return 1 if stale else 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        for proto in PROTOS:
            for rel in generated_files(proto):
                shutil.copyfile(Path(tmp) / rel, ROOT / rel)
                print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
