"""Replay of the Alibaba openb GPU-sharing trace through the extender's own fit and node policies.

Follows the ATC'23 FGD protocol (`../shared/research/fgd-benchmark.md` sections 2 and 7): per seed the pods are
sorted by name and shuffled, then inflated to 130 % of the cluster's GPU capacity by appending uniform resamples
(never deleted); every node gets a random rank that breaks score ties. Each pod goes through kube-scheduler's CPU
and memory fit (vectorised), then `vgpu.scheduler.fit.fit` on every remaining node, then the policy's `score`; the best
node (lowest rank on ties) takes it, or the pod fails with no retry. Results are the unallocated GPU share when
arrivals reach 100 % and 130 % of capacity. Called by `vgpu replay` (scheduler/replay_cli.py) and bench/.

Trace rows map to our resources as `vgpu-number = num_gpu`, `vgpu-cores = gpu_milli / 10` (rounded down; the
exact share is carried by memory) and `vgpu-memory = card MiB * gpu_milli / 1000`. Memory is counted in units of
1/1000 MiB (`MEMORY_UNITS_PER_MIB`) so that this product is exact and fit enforces exactly the trace's milli-GPU.
Fit results are memoised per (GPU state, policy context class, GPU request) and scores per (GPU state, policy
context class, pod spec), since many nodes share a state and many pods a request.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vgpu.errors import ConfigError
from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.fit import FitResult, GPUUsage, binpack_order, fit
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.policies.base import NodeContext, NodePolicy, PodContext, gpu_order_of

__all__ = [
    "CARD_MIB",
    "MEMORY_UNITS_PER_MIB",
    "SPLIT",
    "Cluster",
    "RunResult",
    "ShareRequest",
    "TraceNode",
    "TracePod",
    "arrival_sequence",
    "curve",
    "load_nodes",
    "load_pods",
    "replay",
    "run_one",
]

# GPU model -> card memory in MiB. G2/G3 are undisclosed Alibaba models; 32 GiB is our assumption. Only the
# absolute memory figures depend on it: every trace request is a share of whichever card it lands on.
CARD_MIB: dict[str, int] = {
    "G2": 32768,
    "G3": 32768,
    "T4": 16384,
    "P100": 16384,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
}
DEFAULT_CARD_MIB = 16384
MEMORY_UNITS_PER_MIB = 1000
SPLIT = 1000  # containers per GPU; gpu_milli >= 50 means at most 20 share a GPU, so this never binds
DEVICE_PREFIX = "NVIDIA-"


@dataclass(frozen=True, slots=True)
class ShareRequest(ContainerRequest):
    """A container request whose memory is `permille`/1000 of whichever card it lands on."""

    permille: int = 0

    def memory_on(self, card_memory: int) -> int:
        """Memory units taken on a card of `card_memory` units (exact when the card is a multiple of 1000)."""
        return card_memory * self.permille // 1000


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One row of the node list."""

    name: str
    cpu: int
    memory: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of a pod list (qos, phase and times are ignored, as in the published experiments)."""

    name: str
    cpu: int
    memory: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()

    @property
    def gpu_total(self) -> int:
        """Milli-GPU requested over all its GPUs."""
        return self.num_gpu * self.gpu_milli

    def requests(self) -> tuple[ContainerRequest, ...]:
        """The pod's vGPU requests in our resources (empty for a CPU-only pod)."""
        if self.num_gpu == 0:
            return ()
        return (
            ShareRequest(
                container="main",
                init=False,
                count=self.num_gpu,
                memory=0,
                memory_percent=0,
                cores=self.gpu_milli // 10,
                permille=self.gpu_milli,
            ),
        )

    def selectors(self) -> Selectors:
        """The GPU-model allow list as a type selector."""
        return Selectors(use_types=tuple(s.lower() for s in self.gpu_spec))

    def context(self) -> PodContext:
        """CPU, memory and selectors for the policies."""
        return PodContext(cpu=self.cpu, memory=self.memory, selectors=self.selectors())


def _int(row: dict[str, str], column: str, where: str) -> int:
    try:
        return int(float(row[column] or 0))
    except (KeyError, ValueError):
        raise ConfigError(f"{where}: column {column!r} is missing or not a number") from None


def load_nodes(path: str | Path) -> list[TraceNode]:
    """Read `sn,cpu_milli,memory_mib,gpu,model`, sorted by name."""
    nodes = []
    try:
        with open(path, newline="") as fh:
            for line, row in enumerate(csv.DictReader(fh), start=2):
                where = f"{path} line {line}"
                nodes.append(
                    TraceNode(
                        name=row.get("sn") or row.get("name") or f"node-{line}",
                        cpu=_int(row, "cpu_milli", where),
                        memory=_int(row, "memory_mib", where),
                        gpus=_int(row, "gpu", where),
                        model=(row.get("model") or "").strip(),
                    )
                )
    except OSError as exc:
        raise ConfigError(f"--nodes: cannot read {path}: {exc.strerror}") from None
    if not nodes:
        raise ConfigError(f"--nodes: {path} has no nodes")
    return sorted(nodes, key=lambda n: n.name)


def load_pods(path: str | Path) -> list[TracePod]:
    """Read a pod list, sorted by name; CPU-only rows get gpu_milli 0."""
    pods = []
    try:
        with open(path, newline="") as fh:
            for line, row in enumerate(csv.DictReader(fh), start=2):
                where = f"{path} line {line}"
                num_gpu = _int(row, "num_gpu", where)
                milli = _int(row, "gpu_milli", where) if num_gpu else 0
                if num_gpu and not 0 < milli <= 1000:
                    raise ConfigError(f"{where}: gpu_milli {milli} is outside 1..1000")
                spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s.strip()) if num_gpu else ()
                pods.append(
                    TracePod(
                        name=row["name"],
                        cpu=_int(row, "cpu_milli", where),
                        memory=_int(row, "memory_mib", where),
                        num_gpu=num_gpu,
                        gpu_milli=milli,
                        gpu_spec=spec,
                    )
                )
    except OSError as exc:
        raise ConfigError(f"--pods: cannot read {path}: {exc.strerror}") from None
    if not pods:
        raise ConfigError(f"--pods: {path} has no pods")
    return sorted(pods, key=lambda p: p.name)


def arrival_sequence(
    pods: Sequence[TracePod], capacity_milli: int, n_nodes: int, seed: int, ratio: float = 1.3
) -> tuple[list[int], np.ndarray]:
    """The seed's arrivals (indices into `pods`) and node ranks, shared by every policy.

    Shuffle; then while the GPU request total T is below ratio * capacity, append a uniform resample, stopping at
    the first draw with T + its per-GPU milli over the target (the simulator's check); above the target, remove
    random pods until T <= target. Ranks are a random permutation of the nodes (lower wins ties).
    """
    rng = np.random.default_rng(seed)
    sequence = [int(i) for i in rng.permutation(len(pods))]
    total = sum(pods[i].gpu_total for i in sequence)
    target = ratio * capacity_milli
    if total < target:
        while True:
            j = int(rng.integers(len(pods)))
            if total + pods[j].gpu_milli > target:
                break
            sequence.append(j)
            total += pods[j].gpu_total
    else:
        while total > target and sequence:
            k = int(rng.integers(len(sequence)))
            total -= pods[sequence.pop(k)].gpu_total
    rank = rng.permutation(n_nodes).astype(np.int64)
    return sequence, rank


class Cluster:
    """Nodes as the extender sees them (devices + usage) plus kube-scheduler's CPU/memory accounting."""

    def __init__(self, nodes: Sequence[TraceNode]) -> None:
        self.nodes = list(nodes)
        self.devices: list[tuple[GPUDevice, ...]] = []
        shapes: dict[tuple[str, int], int] = {}
        self.shape = np.zeros(len(nodes), dtype=np.int64)
        for n, node in enumerate(nodes):
            card = CARD_MIB.get(node.model, DEFAULT_CARD_MIB) * MEMORY_UNITS_PER_MIB
            self.devices.append(
                tuple(
                    GPUDevice(
                        uuid=f"{node.name}-gpu{g}",
                        split=SPLIT,
                        memory=card,
                        type=DEVICE_PREFIX + node.model,
                        index=g,
                    )
                    for g in range(node.gpus)
                )
            )
            self.shape[n] = shapes.setdefault((node.model, node.gpus), len(shapes))
        self.cpu_total = np.array([n.cpu for n in nodes], dtype=np.int64)
        self.mem_total = np.array([n.memory for n in nodes], dtype=np.int64)
        self.capacity_milli = 1000 * sum(n.gpus for n in nodes)
        self.reset()

    def reset(self) -> None:
        """Empty every node."""
        self.cpu_free = self.cpu_total.copy()
        self.mem_free = self.mem_total.copy()
        self.usage: list[list[GPUUsage]] = [[GPUUsage() for _ in d] for d in self.devices]
        self._states: dict[tuple, int] = {}
        self.sid = np.array([self._intern(n) for n in range(len(self.nodes))], dtype=np.int64)

    def _intern(self, n: int) -> int:
        key = (int(self.shape[n]), tuple((u.shares, u.memory, u.cores) for u in self.usage[n]))
        return self._states.setdefault(key, len(self._states))

    def context(self, n: int) -> NodeContext:
        """The node context policies may use."""
        return NodeContext(
            cpu_free=int(self.cpu_free[n]),
            memory_free=int(self.mem_free[n]),
            cpu_total=int(self.cpu_total[n]),
            memory_total=int(self.mem_total[n]),
            model=self.nodes[n].model,
        )

    def place(self, n: int, pod: TracePod, result: FitResult) -> None:
        """Charge a placed pod to node n."""
        usage = self.usage[n]
        for indices, grants in zip(result.placement, result.assignment):
            for i, grant in zip(indices, grants):
                usage[i].add(grant.memory, grant.cores)
        self.cpu_free[n] -= pod.cpu
        self.mem_free[n] -= pod.memory
        self.sid[n] = self._intern(n)


@dataclass(slots=True)
class Trace:
    """A loaded trace: nodes and pods."""

    nodes: list[TraceNode]
    pods: list[TracePod]

    @classmethod
    def load(cls, nodes: str | Path, pods: str | Path) -> Trace:
        return cls(load_nodes(nodes), load_pods(pods))


@dataclass(slots=True)
class RunResult:
    """One (policy, seed) replay."""

    policy: str
    seed: int
    unallocated_pct_at_100: float
    unallocated_pct_at_130: float
    failed_pods: int
    seconds: float
    pods: int = 0
    curve: list[float] = field(default_factory=list)  # unallocated % at arrived 0..130

    def summary(self) -> dict[str, object]:
        """The JSON row of `vgpu replay --json`."""
        return {
            "policy": self.policy,
            "seed": self.seed,
            "unallocated_pct_at_100": round(self.unallocated_pct_at_100, 4),
            "unallocated_pct_at_130": round(self.unallocated_pct_at_130, 4),
            "failed_pods": self.failed_pods,
            "seconds": round(self.seconds, 3),
        }


def curve(arrived: np.ndarray, allocated: np.ndarray, capacity_milli: int, top: int = 130) -> np.ndarray:
    """Unallocated % at arrived = 0..top % (mean over events rounding to it, else over the +-1 window)."""
    arrived_pct = np.round(100.0 * arrived / capacity_milli).astype(np.int64)
    alloc_pct = 100.0 * allocated / capacity_milli
    out = np.full(top + 1, np.nan)
    sums = np.bincount(np.clip(arrived_pct, 0, top + 2), weights=alloc_pct, minlength=top + 3)
    counts = np.bincount(np.clip(arrived_pct, 0, top + 2), minlength=top + 3)
    for r in range(top + 1):
        if counts[r]:
            out[r] = sums[r] / counts[r]
        else:
            lo, hi = max(r - 1, 0), r + 2
            if counts[lo:hi].sum():
                out[r] = sums[lo:hi].sum() / counts[lo:hi].sum()
    if counts[0] == 0 and np.isnan(out[0]):
        out[0] = 0.0
    return 100.0 - out


def replay(
    cluster: Cluster,
    pods: Sequence[TracePod],
    sequence: Sequence[int],
    rank: np.ndarray,
    policy: NodePolicy,
    seed: int = 0,
    on_pod: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Schedule `sequence` one pod at a time; returns per-event arrived milli, allocated milli and node (-1 = failed)."""
    cluster.reset()
    bins_fn = getattr(policy, "context_bins", None)
    order_by_bin = getattr(policy, "gpu_order_for", None) is not None
    tie_random = getattr(policy, "tie_break", "rank") == "random"
    tie_rng = np.random.default_rng([seed, 7])
    # Per distinct trace pod: requests, selectors, context and an id for the memo keys.
    spec_ids: dict[tuple, int] = {}
    specs: list[tuple[tuple[ContainerRequest, ...], Selectors, PodContext, int]] = []
    gpu_spec_ids: dict[tuple, int] = {}  # the GPU part alone: what fit depends on besides the node
    pod_spec = np.empty(len(pods), dtype=np.int64)
    for i, p in enumerate(pods):
        key = (p.cpu, p.memory, p.num_gpu, p.gpu_milli, p.gpu_spec)
        sid = spec_ids.get(key)
        if sid is None:
            sid = spec_ids[key] = len(specs)
            gpu_sid = gpu_spec_ids.setdefault(key[2:], len(gpu_spec_ids))
            specs.append((p.requests(), p.selectors(), p.context(), gpu_sid))
        pod_spec[i] = sid
    fit_memo: dict[tuple[int, int, int], FitResult] = {}
    score_memo: dict[tuple[tuple[int, int], int], float | None] = {}
    version = getattr(policy, "epoch", 0)
    n_events = len(sequence)
    arrived_hist = np.zeros(n_events, dtype=np.int64)
    alloc_hist = np.zeros(n_events, dtype=np.int64)
    where = np.full(n_events, -1, dtype=np.int64)
    arrived = allocated = 0
    devices, usage = cluster.devices, cluster.usage
    for e, j in enumerate(sequence):
        pod = pods[j]
        spec = int(pod_spec[j])
        requests, selectors, podctx, gpu_spec = specs[spec]
        arrived += pod.gpu_total
        policy.observe(requests, podctx)
        v = getattr(policy, "epoch", 0)
        if v != version:
            version = v
            fit_memo.clear()
            score_memo.clear()
        # kube-scheduler NodeResourcesFit
        idx = np.flatnonzero((cluster.cpu_free >= pod.cpu) & (cluster.mem_free >= pod.memory))
        chosen = -1
        if len(idx):
            comb = cluster.sid[idx] << 32
            bin_values = [0]
            if bins_fn is not None:  # context classes may be any int64: group on their dense ids
                raw_bins = bins_fn(cluster.cpu_free[idx], cluster.mem_free[idx], podctx).astype(np.int64)
                values, dense = np.unique(raw_bins, return_inverse=True)
                comb |= dense.reshape(-1)
                bin_values = values.tolist()
            uniq, first, inverse = np.unique(comb, return_index=True, return_inverse=True)
            scores = np.empty(len(uniq))
            for k, c in enumerate(uniq.tolist()):
                group = (c >> 32, bin_values[c & 0xFFFFFFFF])
                value = score_memo.get((group, spec), 0)
                if value == 0:
                    n = int(idx[first[k]])
                    fkey = (group[0], group[1] if order_by_bin else 0, gpu_spec)
                    result = fit_memo.get(fkey)
                    ctx = cluster.context(n)
                    if result is None:
                        order = gpu_order_of(policy, ctx, podctx, binpack_order)
                        result = fit(devices[n], usage[n], requests, selectors, order)
                        fit_memo[fkey] = result
                    value = (
                        policy.score(devices[n], usage[n], requests, result, node=ctx, pod=podctx)
                        if result.ok
                        else None
                    )
                    score_memo[(group, spec)] = value
                scores[k] = -np.inf if value is None else value
            node_scores = scores[inverse.reshape(-1)]
            best = node_scores.max()
            if best > -np.inf:
                tied = idx[node_scores == best]
                if tie_random:
                    chosen = int(tied[tie_rng.integers(len(tied))])
                else:
                    chosen = int(tied[np.argmin(rank[tied])])
        if chosen >= 0:
            ctx = cluster.context(chosen)
            order = gpu_order_of(policy, ctx, podctx, binpack_order)
            result = fit(devices[chosen], usage[chosen], requests, selectors, order)
            if not result.ok:  # the memo said it fits; the live call must agree
                raise RuntimeError(f"replay: fit disagrees with its memo on node {cluster.nodes[chosen].name}")
            cluster.place(chosen, pod, result)
            allocated += pod.gpu_total
            where[e] = chosen
        arrived_hist[e] = arrived
        alloc_hist[e] = allocated
        if on_pod is not None:
            on_pod(e)
    return arrived_hist, alloc_hist, where


_TRACES: dict[tuple[str, str], tuple[Trace, Cluster]] = {}


def _loaded(nodes: str, pods: str) -> tuple[Trace, Cluster]:
    key = (str(nodes), str(pods))
    if key not in _TRACES:
        trace = Trace.load(nodes, pods)
        _TRACES[key] = (trace, Cluster(trace.nodes))
    return _TRACES[key]


def prepare_policy(name: str, pods: Sequence[TracePod], seed: int) -> NodePolicy:
    """Build a policy for one run: reseed it and hand oracle policies the trace's workload."""
    policy = make_policy(name)
    if hasattr(policy, "seed"):
        policy.seed(seed)
    if hasattr(policy, "set_workload"):
        policy.set_workload((p.requests(), p.context()) for p in pods)
    return policy


def run_one(nodes: str, pods: str, policy_name: str, seed: int, ratio: float = 1.3) -> RunResult:
    """Replay one (trace, policy, seed)."""
    trace, cluster = _loaded(nodes, pods)
    sequence, rank = arrival_sequence(trace.pods, cluster.capacity_milli, len(trace.nodes), seed, ratio)
    policy = prepare_policy(policy_name, trace.pods, seed)
    start = time.process_time()
    arrived, allocated, where = replay(cluster, trace.pods, sequence, rank, policy, seed)
    seconds = time.process_time() - start
    top = round(100 * ratio)
    unalloc = curve(arrived, allocated, cluster.capacity_milli, top=max(top, 130))
    return RunResult(
        policy=policy_name,
        seed=seed,
        unallocated_pct_at_100=float(unalloc[100]),
        unallocated_pct_at_130=float(unalloc[130]),
        failed_pods=int((where < 0).sum()),
        seconds=seconds,
        pods=len(sequence),
        curve=[float(x) for x in unalloc],
    )


def _run_task(task: tuple[str, str, str, int, float]) -> RunResult:
    return run_one(*task)


def run_many(
    nodes: str,
    pods: str,
    policies: Sequence[str],
    seeds: Iterable[int],
    jobs: int = 1,
    ratio: float = 1.3,
    on_result: Callable[[RunResult, int, int], None] | None = None,
) -> list[RunResult]:
    """Every (policy, seed) pair, in `jobs` processes; `on_result(result, done, total)` after each one."""
    tasks = [(str(nodes), str(pods), name, seed, ratio) for seed in seeds for name in policies]
    results: list[RunResult] = []
    if jobs <= 1:
        for task in tasks:
            results.append(_run_task(task))
            if on_result:
                on_result(results[-1], len(results), len(tasks))
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            for result in pool.imap_unordered(_run_task, tasks):
                results.append(result)
                if on_result:
                    on_result(result, len(results), len(tasks))
    order = {(name, seed): k for k, (_, _, name, seed, _) in enumerate(tasks)}
    return sorted(results, key=lambda r: order[(r.policy, r.seed)])


def summarise(results: Sequence[RunResult], policies: Sequence[str]) -> list[dict[str, float | str | int]]:
    """Per policy: mean, sd (n-1) and median of unallocated % at 100 and 130, mean failed pods and seconds."""
    rows = []
    for name in policies:
        mine = [r for r in results if r.policy == name]
        if not mine:
            continue
        a100 = np.array([r.unallocated_pct_at_100 for r in mine])
        a130 = np.array([r.unallocated_pct_at_130 for r in mine])
        def sd(a):
            return (float(a.std(ddof=1)) if len(a) > 1 else 0.0)
        rows.append(
            {
                "policy": name,
                "seeds": len(mine),
                "mean_100": float(a100.mean()),
                "sd_100": sd(a100),
                "median_100": float(np.median(a100)),
                "mean_130": float(a130.mean()),
                "sd_130": sd(a130),
                "median_130": float(np.median(a130)),
                "failed_pods": float(np.mean([r.failed_pods for r in mine])),
                "seconds": float(np.mean([r.seconds for r in mine])),
            }
        )
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """A plain-text table of `summarise` rows."""
    head = (
        f"{'policy':<10} {'seeds':>5}  {'unalloc@100 mean±sd':>20} {'median':>7}  "
        f"{'unalloc@130 mean±sd':>20} {'median':>7}  {'failed':>7} {'s/run':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['policy']:<10} {r['seeds']:>5}  {r['mean_100']:>12.2f} ± {r['sd_100']:<5.2f} {r['median_100']:>7.2f}  "
            f"{r['mean_130']:>12.2f} ± {r['sd_130']:<5.2f} {r['median_130']:>7.2f}  "
            f"{r['failed_pods']:>7.0f} {r['seconds']:>6.1f}"
        )
    return "\n".join(lines)


def plot_curves(results: Sequence[RunResult], policies: Sequence[str], path: str) -> None:
    """Unallocated % vs arrived % per policy: median over seeds with the 25-75 % band (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in policies:
        curves = np.array([r.curve for r in results if r.policy == name])
        if not len(curves):
            continue
        x = np.arange(curves.shape[1])
        ax.plot(x, np.nanmedian(curves, axis=0), label=name)
        lo, hi = np.nanpercentile(curves, [25, 75], axis=0)
        ax.fill_between(x, lo, hi, alpha=0.2)
    ax.set_xlim(75, curves.shape[1] - 1 if len(results) else 130)
    ax.set_ylim(0, 30)
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("unallocated GPU (% of capacity)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
