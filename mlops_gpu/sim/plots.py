"""PNG plots of simulation results (matplotlib, imported only here, with the Agg backend):
JCT CDF per policy, utilization over time per policy, and each project's share of the GPUs
over time (one file per policy)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from mlops_gpu.sim.simulator import SimResult

BIN_S = 3600.0


def _hourly(result: SimResult) -> tuple[list[float], dict[str, list[float]]]:
    """Hours since the first submit, and per project the mean GPUs held in each hour."""
    start = min(o.job.submit_s for o in result.outcomes)
    end = max((e for _, _, e, _ in result.segments), default=start)
    n = max(1, int((end - start) // BIN_S) + 1)
    held: dict[str, list[float]] = defaultdict(lambda: [0.0] * n)
    for project, s, e, g in result.segments:
        t = s
        while t < e:
            b = int((t - start) // BIN_S)
            stop = min(e, start + (b + 1) * BIN_S)
            held[project][b] += g * (stop - t) / BIN_S
            t = stop
    return [i for i in range(n)], dict(held)


def write_plots(results: list[SimResult], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        paths.append(folder / name)
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)

    hourly = [_hourly(r) for r in results]  # both the utilization and the share plots use it

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        jct = sorted((o.finish - o.job.submit_s) / 3600 for o in r.outcomes if o.finish is not None)
        if jct:
            ax.plot(jct, [(i + 1) / len(jct) for i in range(len(jct))], label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log)")
    ax.set_ylabel("fraction of jobs")
    ax.legend()
    save(fig, "jct_cdf.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    for r, (hours, held) in zip(results, hourly, strict=True):
        total = [sum(v[i] for v in held.values()) / r.cluster.gpus for i in range(len(hours))]
        ax.plot(hours, total, label=r.policy)
    ax.set_xlabel("hours since the first submit")
    ax.set_ylabel("GPU utilization")
    ax.legend()
    save(fig, "utilization.png")

    for r, (hours, held) in zip(results, hourly, strict=True):
        fig, ax = plt.subplots(figsize=(8, 5))
        names = sorted(held)
        ax.stackplot(hours, [held[p] for p in names], labels=names)
        ax.set_xlabel("hours since the first submit")
        ax.set_ylabel("GPUs held")
        ax.set_title(f"share per project: {r.policy}")
        ax.legend(fontsize="small", loc="upper right")
        save(fig, f"share_{r.policy}.png")
    return paths
