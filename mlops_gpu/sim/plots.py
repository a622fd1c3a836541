"""PNG plots of simulation results (matplotlib, imported only here, with the Agg backend):
JCT CDF per policy, utilization over time per policy, and each project's share of the GPUs
over time (one file per policy)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

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
    paths = []

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        jct = sorted((o.finish - o.job.submit_s) / 3600 for o in r.outcomes if o.finish is not None)
        if jct:
            ax.plot(jct, [(i + 1) / len(jct) for i in range(len(jct))], label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log)")
    ax.set_ylabel("fraction of jobs")
    ax.legend()
    paths.append(folder / "jct_cdf.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        hours, held = _hourly(r)
        total = [sum(v[i] for v in held.values()) / r.cluster.gpus for i in range(len(hours))]
        ax.plot(hours, total, label=r.policy)
    ax.set_xlabel("hours since the first submit")
    ax.set_ylabel("GPU utilization")
    ax.legend()
    paths.append(folder / "utilization.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    for r in results:
        hours, held = _hourly(r)
        fig, ax = plt.subplots(figsize=(8, 5))
        names = sorted(held)
        ax.stackplot(hours, [held[p] for p in names], labels=names)
        ax.set_xlabel("hours since the first submit")
        ax.set_ylabel("GPUs held")
        ax.set_title(f"share per project: {r.policy}")
        ax.legend(fontsize="small", loc="upper right")
        paths.append(folder / f"share_{r.policy}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths
