"""Several policies on one trace, side by side: the object ``mlops-gpu simulate --json`` prints
and ``benchmarks/philly_week.py`` extends.

Each policy's replay is independent (its own engine and state), so replays may run in worker
processes; results keep the order the policies were asked in, whatever order they finish in.
``gap_closed`` is filled in for every policy once both references (``fifo-backfill`` and
``srtf-oracle``) are among them, and is null otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from mlops_gpu.sim.metrics import gap_closed, summarize
from mlops_gpu.sim.simulator import Cluster, SimResult, simulate
from mlops_gpu.sim.trace import Trace

#: The policies a comparison runs when none are named: every preset, contenders first.
DEFAULT_POLICIES = (
    "default",
    "fifo-backfill",
    "kueue-like",
    "drf",
    "las",
    "fifo",
    "srtf-oracle",
)


def _one(args: tuple[Trace, Cluster, str, str]) -> SimResult:
    trace, cluster, policy, engine = args
    return simulate(trace, cluster, policy, None, engine)


def compare(
    trace: Trace,
    cluster: Cluster,
    policies: Sequence[str] = DEFAULT_POLICIES,
    *,
    workers: int = 1,
    progress: Callable[[str, int, int], None] | None = None,
    done: Callable[[SimResult], None] | None = None,
    engine: str = "auto",
) -> tuple[dict[str, Any], list[SimResult]]:
    """Replay ``trace`` under each policy. ``progress(policy, finished, total)`` is called
    during a replay (only with ``workers == 1``); ``done(result)`` after each replay;
    ``engine``: as ``simulate``'s."""
    results: list[SimResult] = []
    if workers <= 1:
        for p in policies:
            cb = None if progress is None else (lambda d, n, p=p: progress(p, d, n))
            r = simulate(trace, cluster, p, cb, engine)
            if done is not None:
                done(r)
            results.append(r)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(_one, (trace, cluster, p, engine)) for p in policies]
            for f in futures:
                r = f.result()
                if done is not None:
                    done(r)
                results.append(r)
    rows = [summarize(r) for r in results]
    jct = {row["policy"]: row["avg_jct_s"] for row in rows}
    for row in rows:
        row["gap_closed"] = gap_closed(jct, row["policy"])
    out = {
        "trace": trace.name,
        "nodes": cluster.nodes,
        "gpus": cluster.gpus,
        "jobs": len(trace.jobs),
        "results": rows,
    }
    return out, results
