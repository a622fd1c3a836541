"""Finished runs for accounting (``mlops-gpu history``, ``GET /api/v1/history``), like Slurm's
``sacct``: newest end first, from a time on.

The runs are read through ``ix_runs_finished`` (schema v10: a range on ``finished_at`` read
backwards, stopping at the limit), then their ledger rows (``ix_usage_run``) and the work their
preemptions threw away (``ix_events_run``) for that page of runs only, so a read costs the page,
not the store's history. Reads only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import func, select

from mlops_gpu.model import TERMINAL_PHASES, Run
from mlops_gpu.state.bulk import CHUNK
from mlops_gpu.state.schema import events, runs, usage
from mlops_gpu.state.store import Store


@dataclass(frozen=True, slots=True)
class Finished:
    run: Run
    #: GPU-seconds held per GPU type over all of the run's attempts (the usage ledger).
    gpu_s_by_type: dict[str, float] = field(default_factory=dict)
    #: GPU-seconds of work its preemptions threw away (``preempting`` events' ``lost_gpu_s``).
    lost_gpu_s: float = 0.0


def finished_runs(
    store: Store,
    *,
    since: float,
    projects: Collection[str] | None = None,
    user: str | None = None,
    limit: int = 100,
) -> list[Finished]:
    """Up to ``limit`` runs that ended at or after ``since``, newest end first (``projects``:
    only these; None: all)."""
    q = select(runs).where(
        runs.c.finished_at >= since, runs.c.phase.in_([p.value for p in TERMINAL_PHASES])
    )
    if projects is not None:
        q = q.where(runs.c.project.in_(list(projects)))
    if user is not None:
        q = q.where(runs.c.user == user)
    q = q.order_by(runs.c.finished_at.desc(), runs.c.seq.desc()).limit(limit)
    held: dict[str, dict[str, float]] = defaultdict(dict)
    lost: dict[str, float] = defaultdict(float)
    with store._ro() as conn:
        found = [store._run(r) for r in conn.execute(q)]
        ids = [r.id for r in found]
        for i in range(0, len(ids), CHUNK):
            part = ids[i : i + CHUNK]
            uq = (
                select(usage.c.run_id, usage.c.gpu_type, func.sum(usage.c.gpu_seconds))
                .where(usage.c.run_id.in_(part))
                .group_by(usage.c.run_id, usage.c.gpu_type)
            )
            for run_id, gpu_type, gpu_s in conn.execute(uq):
                held[run_id][gpu_type] = float(gpu_s or 0.0)
            eq = (
                select(events.c.run_id, func.sum(events.c.lost_gpu_s))
                .where(events.c.run_id.in_(part), events.c.kind == "preempting")
                .group_by(events.c.run_id)
            )
            for run_id, lost_s in conn.execute(eq):
                lost[run_id] = float(lost_s or 0.0)
    return [Finished(r, dict(held.get(r.id, {})), lost.get(r.id, 0.0)) for r in found]
