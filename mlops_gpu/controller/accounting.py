"""From the usage ledger to the core's inputs: decayed usage history (fair share) and what each
budgeted project spent in its window (budgets).

Decay: a GPU held over [start, end] contributes the integral of 2^(-(now - t) / h) dt, which is
``h / ln 2 * (2^(-(now - end) / h) - 2^(-(now - start) / h))`` GPU-seconds. Rows older than
``HORIZON`` half-lives weigh less than 0.1% and are not read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from mlops_gpu.core.fairshare import decayed
from mlops_gpu.model import GpuType, Project, Run
from mlops_gpu.state import UsageRow

HORIZON = 10


def usage_history(
    rows: Iterable[UsageRow], now: float, half_life: float
) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = defaultdict(float)
    for r in rows:
        out[(r.project, r.gpu_type)] += decayed(r.gpus, r.start, min(r.end, now), now, half_life)
    return dict(out)


def spent(
    rows: Iterable[UsageRow],
    active: Iterable[Run],
    now: float,
    projects: Mapping[str, Project],
    prices: Mapping[str, GpuType],
) -> dict[str, tuple[float, float]]:
    """(GPU-hours, USD) per budgeted project within its window, running attempts included."""
    windows = {p.name: p.budget.window_s for p in projects.values() if p.budget is not None}
    hours: dict[str, float] = defaultdict(float)
    usd: dict[str, float] = defaultdict(float)

    def add(project: str, gpu_type: str, gpus: float, start: float, end: float) -> None:
        w = windows.get(project)
        if w is None:
            return
        h = gpus * max(min(end, now) - max(start, now - w), 0.0) / 3600
        hours[project] += h
        usd[project] += h * (prices[gpu_type].price_per_hour if gpu_type in prices else 0.0)

    for r in rows:
        add(r.project, r.gpu_type, r.gpus, r.start, r.end)
    for a in active:
        if a.placement is not None and a.admitted_at is not None:
            add(a.project, a.placement.gpu_type, a.placement.gpu_amount, a.admitted_at, now)
    return {p: (hours[p], usd[p]) for p in windows}


def ledger_since(now: float, half_life: float, projects: Mapping[str, Project]) -> float:
    """The oldest ledger time either input needs."""
    longest = max((p.budget.window_s for p in projects.values() if p.budget), default=0.0)
    return now - max(HORIZON * half_life, longest)
