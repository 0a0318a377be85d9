"""Reports of replay runs: per-policy summaries, the text table of `vgpu replay` and the curve plot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vgpu.replay.run import RunResult

__all__ = ["format_table", "plot_curves", "summarise"]


def _sd(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else 0.0


def summarise(results: Sequence[RunResult], policies: Sequence[str]) -> list[dict[str, Any]]:
    """Per policy: mean, sd (n-1) and median of unallocated % at 100 and 130, mean failed pods and seconds."""
    rows = []
    for name in policies:
        mine = [r for r in results if r.policy == name]
        if not mine:
            continue
        a100 = np.array([r.unallocated_pct_at_100 for r in mine])
        a130 = np.array([r.unallocated_pct_at_130 for r in mine])
        rows.append(
            {
                "policy": name,
                "seeds": len(mine),
                "mean_100": float(a100.mean()),
                "sd_100": _sd(a100),
                "median_100": float(np.median(a100)),
                "mean_130": float(a130.mean()),
                "sd_130": _sd(a130),
                "median_130": float(np.median(a130)),
                "failed_pods": float(np.mean([r.failed_pods for r in mine])),
                "seconds": float(np.mean([r.seconds for r in mine])),
            }
        )
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
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
