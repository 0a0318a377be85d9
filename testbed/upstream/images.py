"""The two container images of the real-Kubernetes test tier, written as OCI image-layout archives (no registry).

    python3 testbed/upstream/images.py OUTDIR PAUSE_BINARY

writes OUTDIR/pause.tar (`localhost/vgpu-testbed/pause:1`: only /pause, the pod sandbox image) and OUTDIR/base.tar
(`localhost/vgpu-testbed/base:1`: an empty root filesystem with Debian's usrmerge links; pods mount the host's /usr
read-only to run its programs). `ctr images import` names each image by the `org.opencontainers.image.ref.name`
annotation of its index entry. Every timestamp and owner is fixed, so the digests depend on the content alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

PAUSE_IMAGE = "localhost/vgpu-testbed/pause:1"
BASE_IMAGE = "localhost/vgpu-testbed/base:1"
_BASE_DIRS = ("etc", "proc", "sys", "dev", "tmp", "run", "usr/bin", "usr/lib", "usr/lib64", "usr/local", "opt",
              "var/tmp")
_BASE_LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/bin"}
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}  # uname's machine name -> the OCI (Go) name
_MTIME = 946684800  # 2000-01-01T00:00:00Z
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _tar(entries: Sequence[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """A tar stream of `entries` (member, content), owned by root with fixed timestamps."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, content in entries:
            info.mtime, info.uid, info.gid, info.uname, info.gname = _MTIME, 0, 0, "root", "root"
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes, mode: int = 0o755, link: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.size = kind, mode, link, size
    return info


def base_layer() -> bytes:
    """The base image's only layer: its directories (each parent before its children) and the usrmerge links."""
    names = sorted({"/".join(name.split("/")[:depth]) for name in _BASE_DIRS for depth in
                    range(1, name.count("/") + 2)})
    entries = [(_member(name, tarfile.DIRTYPE, 0o1777 if name in ("tmp", "var/tmp") else 0o755), None)
               for name in names]
    entries += [(_member(name, tarfile.SYMTYPE, 0o777, link=target), None) for name, target in _BASE_LINKS.items()]
    return _tar(entries)


def pause_layer(binary: bytes) -> bytes:
    """The pause image's only layer: the program at /pause."""
    return _tar([(_member("pause", tarfile.REGTYPE, size=len(binary)), binary)])


def image_archive(name: str, layer: bytes, entrypoint: list[str] | None) -> bytes:
    """An OCI image-layout tar archive of one image `name` with one uncompressed `layer` (no `entrypoint`: each
    container names its command)."""
    blobs: dict[str, bytes] = {}

    def blob(media_type: str, content: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(content).hexdigest()
        blobs[digest] = content
        return {"mediaType": media_type, "digest": digest, "size": len(content)}

    def canonical(document: dict) -> bytes:
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    machine = platform.machine()
    target = {"architecture": _ARCHITECTURES.get(machine, machine), "os": "linux"}
    layer_descriptor = blob("application/vnd.oci.image.layer.v1.tar", layer)
    config = blob("application/vnd.oci.image.config.v1+json", canonical({
        **target, "created": "2000-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin"], "WorkingDir": "/",
                   **({"Entrypoint": entrypoint} if entrypoint else {})},
        "rootfs": {"type": "layers", "diff_ids": [layer_descriptor["digest"]]}}))
    manifest = blob(_MANIFEST, canonical({"schemaVersion": 2, "mediaType": _MANIFEST, "config": config,
                                          "layers": [layer_descriptor]}))
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{**manifest, "platform": target,
                            "annotations": {"org.opencontainers.image.ref.name": name}}]}
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = [(_member("blobs", tarfile.DIRTYPE), None),
                                                          (_member("blobs/sha256", tarfile.DIRTYPE), None)]
    files = {"oci-layout": canonical({"imageLayoutVersion": "1.0.0"}), "index.json": canonical(index),
             **{"blobs/sha256/" + digest.removeprefix("sha256:"): content for digest, content in sorted(blobs.items())}}
    entries += [(_member(path, tarfile.REGTYPE, 0o644, size=len(content)), content) for path, content in files.items()]
    return _tar(entries)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} OUTDIR PAUSE_BINARY", file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "pause.tar").write_bytes(image_archive(PAUSE_IMAGE, pause_layer(Path(argv[2]).read_bytes()), ["/pause"]))
    (out / "base.tar").write_bytes(image_archive(BASE_IMAGE, base_layer(), None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
