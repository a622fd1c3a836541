"""Ordering inputs: effective priority (budgets), least-attained-service levels, and the
weighted dominant share that orders projects within a priority class.

share(p) = max over GPU types t of (alloc[p,t] + history[p,t] / half_life) / capacity[t],
divided by p's weight. ``history`` is decayed GPU-seconds (each past second weighs
2^(-age / half_life)), so dividing by the half-life turns it into "GPUs held lately": a project
that ran 300 runs this morning ranks behind one that ran nothing, and less so every hour.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Mapping

from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Budget, Run


def decayed(gpus: float, start: float, end: float, now: float, half_life: float) -> float:
    """GPU-seconds of ``gpus`` held over [start, end], each second weighed 2^(-age / half_life)
    at ``now``: ``h / ln 2 * (2^(-(now - end) / h) - 2^(-(now - start) / h))``. The controller
    (from the usage ledger) and the simulator both build fair-share history with it."""
    if end <= start:
        return 0.0
    k = math.log(2) / half_life
    return gpus / k * (math.exp(-k * (now - end)) - math.exp(-k * (now - start)))


def budget_spent(budget: Budget, hours: float, usd: float) -> bool:
    """Whether GPU-hours ``hours`` or ``usd`` spent in the window reach ``budget``."""
    gpu_hours, limit_usd = budget.gpu_hours, budget.usd
    return (gpu_hours is not None and hours >= gpu_hours) or (
        limit_usd is not None and usd >= limit_usd
    )


def budget_exceeded(snap: Snapshot, project: str) -> str | None:
    """A sentence saying the project's budget is spent (as ``budget_spent`` judges), or
    None."""
    proj = snap.projects.get(project)
    if proj is None or proj.budget is None:
        return None
    b = proj.budget
    hours, usd = snap.spent.get(project, (0.0, 0.0))
    window = f"{b.window_s / 3600:g}h"
    if b.gpu_hours is not None and hours >= b.gpu_hours:
        return (
            f"project {project} spent {hours:.1f} of its {b.gpu_hours:g} GPU-hour budget "
            f"per {window}"
        )
    if b.usd is not None and usd >= b.usd:
        return f"project {project} spent ${usd:.2f} of its ${b.usd:g} budget per {window}"
    return None


def las_level(snap: Snapshot, attained_gpu_s: float) -> int:
    """0 for the least attained service; one more per threshold passed."""
    return bisect_right(snap.policy.las_thresholds_gpu_s, attained_gpu_s)


def attained_now(snap: Snapshot, run: Run) -> float:
    """GPU-seconds over all attempts, the current one included (active runs)."""
    held = 0.0
    if run.placement is not None and run.admitted_at is not None:
        held = run.placement.gpu_amount * max(snap.now - run.admitted_at, 0.0)
    return run.attained_gpu_s + held


class Shares:
    def __init__(
        self, snap: Snapshot, used: Mapping[tuple[str, str], float], capacity: Mapping[str, float]
    ) -> None:
        self.snap = snap
        self.capacity = capacity
        self.load: dict[tuple[str, str], float] = defaultdict(float)
        h = max(snap.policy.half_life_s, 1.0)
        for key, gpu_s in snap.usage_history.items():
            self.load[key] += gpu_s / h
        for key, amount in used.items():
            self.load[key] += amount
        self._share: dict[str, float] = {}

    def share(self, project: str) -> float:
        if not self.snap.policy.fair_share:
            return 0.0
        s = self._share.get(project)
        if s is None:
            weight = self.snap.projects[project].weight if project in self.snap.projects else 1.0
            s = (
                max(
                    (self.load[(project, t)] / c for t, c in self.capacity.items() if c > 0),
                    default=0.0,
                )
                / weight
            )
            self._share[project] = s
        return s

    def share_with(self, project: str, gpu_type: str, amount: float) -> float:
        """``share`` as it would be with ``amount`` more of ``gpu_type`` held (nothing changes:
        a what-if must not move the floats a later decision reads)."""
        if not self.snap.policy.fair_share:
            return 0.0
        weight = self.snap.projects[project].weight if project in self.snap.projects else 1.0
        return (
            max(
                (
                    (self.load[(project, t)] + (amount if t == gpu_type else 0.0)) / c
                    for t, c in self.capacity.items()
                    if c > 0
                ),
                default=0.0,
            )
            / weight
        )

    def add(self, project: str, gpu_type: str, amount: float) -> None:
        self.load[(project, gpu_type)] += amount
        self._share.pop(project, None)
