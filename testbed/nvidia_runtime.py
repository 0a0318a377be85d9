"""TEST INFRASTRUCTURE: the NVIDIA container runtime's part on a simulated node of the real-Kubernetes tier.

On a GPU node containerd runs containers through `nvidia-container-runtime`, a wrapper of runc that reads
`NVIDIA_VISIBLE_DEVICES` from the OCI spec at `create` and adds the driver of the GPUs it names (device nodes,
libcuda.so.1, libnvidia-ml.so.1) before runc starts the container; without that variable, or with `void` / `none`,
it leaves the spec alone. This module plays that wrapper over the test bed's simulated driver: containerd is
configured with it as runc's binary (`BinaryName`), and at `create` it adds to the bundle's config.json

  * the simulated libraries' directory, read-only at the same path, first in `LD_LIBRARY_PATH` (where the real
    toolkit puts the libraries in the container's library directory: a simplification);
  * `SIMGPU_DEVICES` with the node's GPUs that the list names (UUIDs, indices or `all`, as testbed/machine.py's
    `visible` reads them) and `SIMGPU_STATE`, the node's shared simulator state, mounted read-write;

then it replaces itself with runc, with the same arguments. A name the node does not have fails the create, as
nvidia-container-cli refuses an unknown device. Upstream facts: NVIDIA container toolkit,
`cmd/nvidia-container-runtime` (the `create` modifier) and its `NVIDIA_VISIBLE_DEVICES` documentation.

Run by containerd's shim as `python -m vgpu.testbed.nvidia_runtime --gpus SPEC --node NAME --sim-dir D
--state-dir S --runc PATH -- <runc arguments>` through a small executable file the harness writes per node.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from vgpu.testbed.machine import UnknownDevice, machine, simgpu_env, visible

__all__ = ["add_gpus", "main", "wrapper_script"]

_GLOBAL_OPTIONS_WITH_VALUE = ("--root", "--log", "--log-format", "--criu", "--rootless")  # runc(8) global options


def _bundle(runc_args: list[str]) -> Path | None:
    """The bundle directory of a `create` (or `run`) call, None for every other runc command."""
    args = list(runc_args)
    command, i = None, 0
    while i < len(args):  # runc's global options come first; some take a value
        if args[i] in _GLOBAL_OPTIONS_WITH_VALUE:
            i += 2
        elif args[i].startswith("-"):
            i += 1
        else:
            command = args[i]
            break
    if command not in ("create", "run"):
        return None
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--bundle="):
            return Path(arg.split("=", 1)[1])
    return Path.cwd()


def add_gpus(spec: dict, gpus: str, node: str, sim_dir: Path, state_dir: Path) -> bool:
    """Add the simulated driver of the GPUs `spec`'s NVIDIA_VISIBLE_DEVICES names; False when it names none."""
    process = spec.setdefault("process", {})
    env: list[str] = process.setdefault("env", [])
    values = {item.split("=", 1)[0]: item.split("=", 1)[1] for item in env if "=" in item}
    wanted = values.get("NVIDIA_VISIBLE_DEVICES", "")
    if wanted in ("", "void", "none"):
        return False
    chosen = visible(machine(gpus, node), [n.strip() for n in wanted.split(",")])
    extra = simgpu_env(chosen, state_dir)
    library_path = ":".join(p for p in (str(sim_dir), values.get("LD_LIBRARY_PATH", "")) if p)
    extra["LD_LIBRARY_PATH"] = library_path
    env[:] = [item for item in env if item.split("=", 1)[0] not in extra] + [f"{k}={v}" for k, v in extra.items()]
    mounts = spec.setdefault("mounts", [])
    mounts.append({"destination": str(sim_dir), "type": "bind", "source": str(sim_dir),
                   "options": ["rbind", "ro", "nosuid"]})
    mounts.append({"destination": str(state_dir), "type": "bind", "source": str(state_dir),
                   "options": ["rbind", "rw"]})
    return True


def wrapper_script(path: Path, gpus: str, node: str, sim_dir: Path, state_dir: Path, runc: str) -> Path:
    """Write the executable containerd calls as runc for this node; its path."""
    argv = [sys.executable, "-m", "vgpu.testbed.nvidia_runtime", "--gpus", gpus, "--node", node,
            "--sim-dir", str(sim_dir), "--state-dir", str(state_dir), "--runc", runc, "--"]
    path.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"\n')
    path.chmod(0o755)
    return path


def main(argv: list[str] | None = None) -> None:
    """Edit the bundle of a create, then exec runc with the arguments after `--`."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    split = args_in.index("--") if "--" in args_in else len(args_in)
    ap = argparse.ArgumentParser(prog="nvidia_runtime")
    ap.add_argument("--gpus", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--sim-dir", type=Path, required=True)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--runc", required=True)
    args = ap.parse_args(args_in[:split])
    runc_args = args_in[split + 1:]
    bundle = _bundle(runc_args)
    if bundle is not None:
        config = bundle / "config.json"
        spec = json.loads(config.read_text())
        try:
            changed = add_gpus(spec, args.gpus, args.node, args.sim_dir, args.state_dir)
        except UnknownDevice as exc:
            print(f"nvidia-container-runtime (test bed): {exc}", file=sys.stderr)
            sys.exit(1)
        if changed:
            config.write_text(json.dumps(spec))
    os.execv(args.runc, [args.runc, *runc_args])


if __name__ == "__main__":
    main()
