"""Trace variants: workloads and clusters derived from an openb trace by documented, seeded transformations.

The generalisation suite (bench/placement_suite.py, docs/placement.md) replays each variant under the FGD protocol,
so that a policy is measured on workloads nobody tuned it on. Every variant is a pure function of the base trace
and `VARIANT_SEED`; the names say what changes:

- `multigpuXX`: multi-GPU pods make XX % of the GPU request (clones of the trace's multi-GPU pods appended);
- `shareXX`: sharing pods (one GPU, less than a whole one) make XX % of the GPU request (random ones removed, or
  clones appended);
- `gpuspecXX`: XX % of the GPU request is pinned to GPU models: GPU pods in random order get an allow-list drawn
  uniformly from `PIN_LISTS` (only lists whose nodes can hold the pod), until the pinned request reaches XX %;
- `cpuonlyXX`: CPU-only pods make XX % of the pods (clones appended, or random ones removed);
- `cpuXXX`: every GPU pod asks XXX % of its CPU and memory (CPU and memory per GPU scaled);
- `nodes4`: every 8-GPU node is split into two 4-GPU nodes with half its CPU and memory (node mix);
- `types2`: the card models are merged into two (G2 and G3 become `GA`, the rest `GB`) and 25 % of the GPU request
  is pinned to one of them (fewer card types);
- `types12`: every node of model M becomes `Ma` or `Mb` at random, and 25 % of the GPU request is pinned to one of
  the new models (more card types);
- `nvlink`, `nvlink30`: the nodes publish their topology: an 8-GPU node is two NVLink islands of 4 GPUs, each its
  own NUMA node, a smaller node one island (`TraceNode.islands`); `nvlink30` on the workload of `multigpu30`.

Clones are named `<pod>-v<i>`; split nodes `<node>-a` and `-b`. Used by `vgpu replay --variant` and bench/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from vgpu.errors import ConfigError
from vgpu.replay.trace import Trace, TraceNode, TracePod

__all__ = ["PIN_LISTS", "VARIANTS", "VARIANT_SEED", "Variant", "derive"]

VARIANT_SEED = 2023
# allow-lists a pinned pod may get: every model with at least 3 % of the GPUs, and the artifact's V100 pair
PIN_LISTS: tuple[tuple[str, ...], ...] = (
    ("G2",), ("T4",), ("G3",), ("P100",), ("V100M32",), ("V100M16",), ("V100M16", "V100M32"),
)


@dataclass(frozen=True, slots=True)
class Variant:
    """A named transformation of a trace."""

    name: str
    summary: str
    apply: Callable[[Trace, np.random.Generator], Trace]


def _is_multi(p: TracePod) -> bool:
    return p.num_gpu > 1


def _is_share(p: TracePod) -> bool:
    return p.num_gpu == 1 and p.gpu_milli < 1000


def _is_cpu_only(p: TracePod) -> bool:
    return p.num_gpu == 0


def _clone(p: TracePod, i: int) -> TracePod:
    return replace(p, name=f"{p.name}-v{i}")


def _gpu_share(kind: Callable[[TracePod], bool], share: float) -> Callable[[Trace, np.random.Generator], Trace]:
    """Pods of `kind` make `share` of the GPU request: clones of them appended, or random ones removed."""

    def apply(trace: Trace, rng: np.random.Generator) -> Trace:
        pods = list(trace.pods)
        mine = [p for p in pods if kind(p)]
        part, total = sum(p.gpu_total for p in mine), sum(p.gpu_total for p in pods)
        if part < share * total:
            i = 0
            while part < share * total:
                p = _clone(mine[int(rng.integers(len(mine)))], i)
                pods.append(p)
                part, total, i = part + p.gpu_total, total + p.gpu_total, i + 1
            return Trace(trace.nodes, pods)
        removed: set[int] = set()
        for k in rng.permutation([k for k, p in enumerate(pods) if kind(p)]).tolist():
            if part <= share * total:
                break
            removed.add(k)
            part, total = part - pods[k].gpu_total, total - pods[k].gpu_total
        return Trace(trace.nodes, [p for k, p in enumerate(pods) if k not in removed])

    return apply


def _cpu_only(share: float) -> Callable[[Trace, np.random.Generator], Trace]:
    """CPU-only pods make `share` of the pods: clones appended, or random ones removed."""

    def apply(trace: Trace, rng: np.random.Generator) -> Trace:
        pods = list(trace.pods)
        mine = [p for p in pods if _is_cpu_only(p)]
        count, i = len(mine), 0
        if count < share * len(pods):
            while count < share * len(pods):
                pods.append(_clone(mine[int(rng.integers(len(mine)))], i))
                count, i = count + 1, i + 1
            return Trace(trace.nodes, pods)
        removed: set[int] = set()
        for k in rng.permutation([k for k, p in enumerate(pods) if _is_cpu_only(p)]).tolist():
            if count <= share * (len(pods) - len(removed)):
                break
            removed.add(k)
            count -= 1
        return Trace(trace.nodes, [p for k, p in enumerate(pods) if k not in removed])

    return apply


def _pin(trace: Trace, rng: np.random.Generator, share: float, lists: tuple[tuple[str, ...], ...]) -> Trace:
    """Pin GPU pods (random order) to allow-lists drawn uniformly from `lists` (those with a node big enough for
    the pod) until the pinned GPU request reaches `share` of it."""
    largest = {models: max((n.gpus for n in trace.nodes if n.model in models), default=0) for models in lists}
    pods = list(trace.pods)
    total = sum(p.gpu_total for p in pods)
    pinned = sum(p.gpu_total for p in pods if p.gpu_spec)
    for k in rng.permutation(len(pods)).tolist():
        if pinned >= share * total:
            break
        p = pods[k]
        if not p.num_gpu or p.gpu_spec:
            continue
        fitting = [models for models in lists if largest[models] >= p.num_gpu]
        pods[k] = replace(p, gpu_spec=fitting[int(rng.integers(len(fitting)))])
        pinned += p.gpu_total
    return Trace(trace.nodes, pods)


def _pinned(share: float) -> Callable[[Trace, np.random.Generator], Trace]:
    def apply(trace: Trace, rng: np.random.Generator) -> Trace:
        return _pin(trace, rng, share, PIN_LISTS)

    return apply


def _cpu_per_gpu(factor: float) -> Callable[[Trace, np.random.Generator], Trace]:
    """Every GPU pod asks `factor` times its CPU and memory."""

    def apply(trace: Trace, rng: np.random.Generator) -> Trace:
        pods = [replace(p, cpu=round(p.cpu * factor), memory=round(p.memory * factor)) if p.num_gpu else p
                for p in trace.pods]
        return Trace(trace.nodes, pods)

    return apply


def _nodes4(trace: Trace, rng: np.random.Generator) -> Trace:
    """Every 8-GPU node becomes two 4-GPU nodes with half its CPU and memory each."""
    nodes: list[TraceNode] = []
    for n in trace.nodes:
        if n.gpus == 8:
            half = replace(n, gpus=4, cpu=n.cpu // 2, memory=n.memory // 2)
            nodes += [replace(half, name=f"{n.name}-a"), replace(half, name=f"{n.name}-b")]
        else:
            nodes.append(n)
    return Trace(sorted(nodes, key=lambda n: n.name), list(trace.pods))


def _types2(trace: Trace, rng: np.random.Generator) -> Trace:
    """Two card types (G2 and G3 as `GA`, the rest as `GB`), a quarter of the GPU request pinned to one."""
    nodes = [replace(n, model="GA" if n.model in ("G2", "G3") else "GB") for n in trace.nodes]
    return _pin(Trace(nodes, list(trace.pods)), rng, 0.25, (("GA",), ("GB",)))


def _types12(trace: Trace, rng: np.random.Generator) -> Trace:
    """Each node of model M becomes `Ma` or `Mb` (a coin per node), a quarter of the GPU request pinned to one
    of the new models with at least 3 % of the GPUs."""
    nodes = [replace(n, model=n.model + ("a" if rng.random() < 0.5 else "b")) for n in trace.nodes]
    gpus: dict[str, int] = {}
    for n in nodes:
        gpus[n.model] = gpus.get(n.model, 0) + n.gpus
    total = sum(gpus.values())
    lists = tuple((m,) for m in sorted(gpus) if gpus[m] >= 0.03 * total)
    return _pin(Trace(nodes, list(trace.pods)), rng, 0.25, lists)


def _nvlink(trace: Trace, rng: np.random.Generator) -> Trace:
    """Every 8-GPU node two NVLink islands (and NUMA nodes) of 4 GPUs, every smaller node one island."""
    return Trace([replace(n, islands=2 if n.gpus == 8 else 1) for n in trace.nodes], list(trace.pods))


def _nvlink_multigpu(share: float) -> Callable[[Trace, np.random.Generator], Trace]:
    def apply(trace: Trace, rng: np.random.Generator) -> Trace:
        return _nvlink(_gpu_share(_is_multi, share)(trace, rng), rng)

    return apply


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("multigpu30", "multi-GPU pods make 30 % of the GPU request", _gpu_share(_is_multi, 0.30)),
    Variant("multigpu50", "multi-GPU pods make 50 % of the GPU request", _gpu_share(_is_multi, 0.50)),
    Variant("share10", "sharing pods make 10 % of the GPU request", _gpu_share(_is_share, 0.10)),
    Variant("gpuspec10", "10 % of the GPU request pinned to GPU models", _pinned(0.10)),
    Variant("gpuspec25", "25 % of the GPU request pinned to GPU models", _pinned(0.25)),
    Variant("gpuspec33", "33 % of the GPU request pinned to GPU models", _pinned(0.33)),
    Variant("cpuonly25", "CPU-only pods make 25 % of the pods", _cpu_only(0.25)),
    Variant("cpu50", "GPU pods ask half their CPU and memory", _cpu_per_gpu(0.5)),
    Variant("cpu200", "GPU pods ask twice their CPU and memory", _cpu_per_gpu(2.0)),
    Variant("nodes4", "8-GPU nodes split into two 4-GPU nodes", _nodes4),
    Variant("types2", "two card types, 25 % of the GPU request pinned", _types2),
    Variant("types12", "twelve card types, 25 % of the GPU request pinned", _types12),
    Variant("nvlink", "8-GPU nodes two NVLink islands of 4 GPUs, smaller nodes one", _nvlink),
    Variant("nvlink30", "nvlink's topology, multi-GPU pods 30 % of the GPU request", _nvlink_multigpu(0.30)),
)}


def derive(trace: Trace, name: str) -> Trace:
    """The variant `name` of `trace` (the same for every call: seeded with VARIANT_SEED)."""
    variant = VARIANTS.get(name)
    if variant is None:
        raise ConfigError(f"--variant: unknown variant {name!r} (known: {', '.join(VARIANTS)})")
    return variant.apply(trace, np.random.default_rng(VARIANT_SEED))
