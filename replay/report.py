"""Reports of replay runs: per-policy summaries, the text tables of `vgpu replay` (with and without
`--departures`) and the curve plots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vgpu.replay.events import DeparturesResult
from vgpu.replay.run import RunResult

__all__ = ["format_departures_table", "format_table", "plot_curves", "plot_departures", "summarise",
           "summarise_departures"]

# the figures of a departures run that its summary averages, in table order
DEPARTURE_FIGURES = ("allocated_pct_mean", "allocated_pct_end", "waiting_pct_mean", "never_placed", "delay_mean_s",
                     "delay_p95_s", "seconds")


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
    fig, ax = _figure()
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
    _save(fig, ax, path, legend_size="medium")


def summarise_departures(results: Sequence[DeparturesResult], policies: Sequence[str]) -> list[dict[str, Any]]:
    """Per policy: mean and sd (n-1) of each of DEPARTURE_FIGURES over seeds."""
    rows = []
    for name in policies:
        mine = [r for r in results if r.policy == name]
        if not mine:
            continue
        row: dict[str, Any] = {"policy": name, "seeds": len(mine)}
        for figure in DEPARTURE_FIGURES:
            values = np.array([getattr(r, figure) for r in mine], dtype=np.float64)
            row[figure], row[f"sd_{figure}"] = float(values.mean()), _sd(values)
        rows.append(row)
    return rows


def format_departures_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of `summarise_departures` rows."""
    head = (f"{'policy':<10} {'seeds':>5}  {'allocated % mean±sd':>20}  {'last 25 %':>14}  {'waiting %':>9}  "
            f"{'never placed':>12}  {'delay mean s':>12} {'p95 s':>7} {'s/run':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['policy']:<10} {r['seeds']:>5}  {r['allocated_pct_mean']:>12.2f} ± {r['sd_allocated_pct_mean']:<5.2f}"
            f"  {r['allocated_pct_end']:>6.2f} ± {r['sd_allocated_pct_end']:<5.2f}  {r['waiting_pct_mean']:>9.2f}  "
            f"{r['never_placed']:>12.0f}  {r['delay_mean_s']:>12.1f} {r['delay_p95_s']:>7.1f} {r['seconds']:>6.1f}"
        )
    return "\n".join(lines)


def plot_departures(results: Sequence[DeparturesResult], policies: Sequence[str], path: str) -> None:
    """Allocated % over the run per policy (median over seeds, 25-75 % band) and the waiting share (matplotlib)."""
    fig, ax = _figure()
    for name in policies:
        mine = [r for r in results if r.policy == name]
        if not mine:
            continue
        allocated = np.array([r.allocated_curve for r in mine])
        x = np.linspace(0, 100, allocated.shape[1])
        line = ax.plot(x, np.median(allocated, axis=0), label=f"{name} allocated")[0]
        lo, hi = np.percentile(allocated, [25, 75], axis=0)
        ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color())
        waiting = np.median(np.array([r.waiting_curve for r in mine]), axis=0)
        ax.plot(x, waiting, linestyle=":", color=line.get_color(), label=f"{name} waiting")
    ax.set_xlabel("time (% of the run)")
    ax.set_ylabel("GPU (% of capacity)")
    _save(fig, ax, path, legend_size="small")


def _figure() -> tuple[Any, Any]:
    """A figure and its axes, drawn off-screen (matplotlib is imported only when a plot is asked for)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7, 4.5))


def _save(fig: Any, ax: Any, path: str, legend_size: str) -> None:
    """Grid, legend and layout, then write the figure to `path` and free it."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
