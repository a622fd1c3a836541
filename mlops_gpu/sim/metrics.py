"""The metrics of BENCHMARKS.md, from a simulation's job outcomes and allocation segments.

- JCT = finish - submit; wait = first start - submit; slowdown = JCT / runtime (runtime floored
  at 1 s, so zero-length jobs do not divide by zero); makespan = last finish - first submit.
- utilization = GPU-hours allocated (every attempt, lost work included) / (GPUs x makespan);
  its bound is the offered load, total GPU-hours of work over the same, capped at 1.
- Jain: 1-hour windows from the first submit; in each, every project's weighted max-min fair
  share of the window's GPU-seconds (weights = nominal quotas; each capped at its demand: the
  integral of the GPUs its submitted, unfinished jobs ask for); x = allocated / fair share for
  each project with a share; Jain's index of the x. Only congested windows count (demand above
  capacity, two or more projects with demand); the mean is weighted by allocated GPU-seconds.
- gap closed = (JCT[fifo-backfill] - JCT[P]) / (JCT[fifo-backfill] - JCT[srtf-oracle]).
Jobs that never finished are left out of the JCT figures (their count is reported).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from mlops_gpu.sim.eta import eta_metrics
from mlops_gpu.sim.simulator import SimResult

WINDOW_S = 3600.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of ``values`` (sorted or not)."""
    if not values:
        return 0.0
    s = sorted(values)
    rank = max(1, min(len(s), -(-q * len(s) // 100)))  # ceil(q/100 * n)
    return s[int(rank) - 1]


def water_fill(
    capacity: float, demand: Mapping[str, float], weight: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity``: each project gets weight x level, capped at
    its demand, with the level raised until capacity or every demand is met."""
    active = {p for p, d in demand.items() if d > 0 and weight.get(p, 0.0) > 0}
    share = dict.fromkeys(demand, 0.0)
    left = capacity
    while active and left > 1e-9:
        total_w = sum(weight[p] for p in active)
        level = left / total_w
        capped = {p for p in active if demand[p] - share[p] <= weight[p] * level + 1e-12}
        if not capped:
            for p in active:
                share[p] += weight[p] * level
            break
        for p in capped:
            left -= demand[p] - share[p]
            share[p] = demand[p]
        active -= capped
    return share


def jain_index(xs: Iterable[float]) -> float:
    v = list(xs)
    if not v:
        return 1.0
    sq = sum(x * x for x in v)
    return (sum(v) ** 2) / (len(v) * sq) if sq > 0 else 1.0


def _integrate(
    steps: list[tuple[float, str, float]], start: float, end: float, width: float
) -> list[dict[str, float]]:
    """Per window of ``width`` over [start, end): project -> integral of a step function given
    as (time, project, delta) changes."""
    n = max(1, int(-(-(end - start) // width)))
    out: list[dict[str, float]] = [defaultdict(float) for _ in range(n)]
    level: dict[str, float] = defaultdict(float)
    steps = sorted(steps)
    t = start
    i = 0
    while t < end:
        while i < len(steps) and steps[i][0] <= t:
            _, p, d = steps[i]
            level[p] += d
            i += 1
        w = min(int((t - start) // width), n - 1)
        t_next = min(steps[i][0] if i < len(steps) else end, start + (w + 1) * width, end)
        for p, lv in level.items():
            if lv:
                out[w][p] += lv * (t_next - t)
        t = t_next
    return out


def fairness(result: SimResult) -> tuple[float, int]:
    """(allocation-weighted mean Jain index over congested windows, how many counted)."""
    done = [o for o in result.outcomes if o.finish is not None]
    if not done:
        return 1.0, 0
    start = min(o.job.submit_s for o in result.outcomes)
    end = max(o.finish for o in done if o.finish is not None)
    demand_steps: list[tuple[float, str, float]] = []
    for o in result.outcomes:
        stop = o.finish if o.finish is not None else end
        demand_steps.append((o.job.submit_s, o.job.project, o.job.total_gpus))
        demand_steps.append((stop, o.job.project, -o.job.total_gpus))
    alloc_steps: list[tuple[float, str, float]] = []
    for project, s, e, g in result.segments:
        alloc_steps.append((s, project, g))
        alloc_steps.append((e, project, -g))
    demand = _integrate(demand_steps, start, end, WINDOW_S)
    alloc = _integrate(alloc_steps, start, end, WINDOW_S)
    weights = {p: float(n) for p, n in result.nominal.items()}
    total, weighted, counted = 0.0, 0.0, 0
    for w, (dem, al) in enumerate(zip(demand, alloc, strict=True)):
        width = min(WINDOW_S, end - (start + w * WINDOW_S))
        cap = result.cluster.gpus * width
        askers = [p for p, d in dem.items() if d > 1e-9]
        if sum(dem.values()) <= cap + 1e-9 or len(askers) < 2:
            continue
        fair = water_fill(cap, dem, weights)
        xs = [al.get(p, 0.0) / f for p, f in fair.items() if f > 1e-9]
        if not xs:
            continue
        got = sum(al.values())
        weighted += jain_index(xs) * got
        total += got
        counted += 1
    return (weighted / total if total > 0 else 1.0), counted


def summarize(result: SimResult) -> dict[str, Any]:
    """One policy's row of ``simulate --json``."""
    done = [o for o in result.outcomes if o.finish is not None and o.first_start is not None]
    jct = [o.finish - o.job.submit_s for o in done if o.finish is not None]
    wait = [o.first_start - o.job.submit_s for o in done if o.first_start is not None]
    slow = [
        (o.finish - o.job.submit_s) / max(o.job.duration_s, 1.0)
        for o in done
        if o.finish is not None
    ]
    first = min((o.job.submit_s for o in result.outcomes), default=0.0)
    last = max((o.finish for o in done if o.finish is not None), default=first)
    makespan = last - first
    capacity_s = result.cluster.gpus * makespan
    allocated = sum((e - s) * g for _, s, e, g in result.segments)
    work = sum(o.job.gpu_seconds for o in result.outcomes)
    jain, windows = fairness(result)
    n = len(jct)
    return {
        "policy": result.policy,
        "avg_jct_s": sum(jct) / n if n else 0.0,
        "p50_jct_s": percentile(jct, 50),
        "p99_jct_s": percentile(jct, 99),
        "avg_wait_s": sum(wait) / n if n else 0.0,
        "p99_wait_s": percentile(wait, 99),
        "avg_slowdown": sum(slow) / n if n else 0.0,
        "makespan_s": makespan,
        "utilization": allocated / capacity_s if capacity_s > 0 else 0.0,
        "utilization_bound": min(1.0, work / capacity_s) if capacity_s > 0 else 0.0,
        "jain": jain,
        "jain_windows": windows,
        "quota_violations": result.quota_violations,
        "preemptions": result.preemptions,
        "lost_gpu_hours": sum(o.lost_gpu_s for o in result.outcomes) / 3600.0,
        "decisions_per_s": result.cycles / result.cycle_wall_s if result.cycle_wall_s else 0.0,
        "wall_s": result.wall_s,
        "unfinished": result.unfinished,
        "cancelled": result.cancelled,
        **eta_metrics(result.etas, {o.job.id: o.first_start for o in result.outcomes}),
    }


def gap_closed(avg_jct: Mapping[str, float], policy: str) -> float | None:
    """How much of the JCT gain between ``fifo-backfill`` and ``srtf-oracle`` ``policy`` takes
    (None without both references)."""
    base, best = avg_jct.get("fifo-backfill"), avg_jct.get("srtf-oracle")
    if base is None or best is None or abs(base - best) < 1e-9:
        return None
    return (base - avg_jct[policy]) / (base - best)
