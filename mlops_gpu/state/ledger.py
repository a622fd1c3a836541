"""The usage ledger: one row per ended attempt that held GPUs (who, what, how long, outcome).

Rows are only ever added, with growing ids, in the same transaction as the phase change that
ends the attempt (``Store.finish``, ``Store.requeue``), so the ledger and the runs table never
disagree after a crash. Fair share, budgets, reports and the MLflow notes read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row, select

from mlops_gpu.model import Placement
from mlops_gpu.state.schema import usage


@dataclass(frozen=True, slots=True)
class UsageRow:
    run_id: str
    attempt: int
    project: str
    user: str
    gpu_type: str
    backend: str
    gpus: float
    start: float
    end: float
    gpu_seconds: float
    outcome: str
    #: When the attempt joined the queue (its wait is ``start - queued_at``); None in rows
    #: written before schema v4.
    queued_at: float | None = None
    #: Mean GPU utilization (percent) the launcher sampled; None without a device or NVML.
    mean_util: float | None = None
    #: Seconds the attempt's GPUs sat idle past the idle window: ``gpus * idle_s`` is wasted.
    idle_s: float = 0.0
    #: The ledger row's id: rows are only ever added, with growing ids (not part of equality).
    id: int = field(default=0, compare=False)


def read_usage(
    conn: Connection, since: float | None = None, after_id: int | None = None
) -> list[UsageRow]:
    """Ledger rows ending at or after ``since``, with an id above ``after_id``, by id."""
    q = select(usage).order_by(usage.c.id)
    if since is not None:
        q = q.where(usage.c.end >= since)
    if after_id is not None:
        q = q.where(usage.c.id > after_id)
    return [
        UsageRow(
            r.run_id,
            r.attempt,
            r.project,
            r.user,
            r.gpu_type,
            r.backend,
            r.gpus,
            r.start,
            r.end,
            r.gpu_seconds,
            r.outcome,
            queued_at=r.queued_at,
            mean_util=r.mean_util,
            idle_s=r.idle_s or 0.0,
            id=r.id,
        )
        for r in conn.execute(q)
    ]


def record_usage(
    conn: Connection,
    row: Row[Any],
    now: float,
    outcome: str,
    mean_util: float | None = None,
    idle_s: float = 0.0,
) -> float:
    """Record the attempt of the runs-table ``row`` in the ledger; returns the GPU-seconds
    recorded (0 for an attempt that never held GPUs: no row is written).

    ``idle_s`` is capped at the attempt's held time (a launcher clock ahead of ours must not
    book more waste than use)."""
    if not row.placement or row.admitted_at is None:
        return 0.0
    p = Placement.from_dict(json.loads(row.placement))
    gpus = p.gpu_amount
    held = max(now - row.admitted_at, 0.0)
    gpu_s = float(gpus * held)
    conn.execute(
        usage.insert().values(
            run_id=row.id,
            attempt=row.attempt,
            project=row.project,
            user=row.user,
            gpu_type=p.gpu_type,
            backend=p.backend,
            gpus=gpus,
            start=row.admitted_at,
            end=now,
            gpu_seconds=gpu_s,
            outcome=outcome,
            queued_at=row.queued_at if row.queued_at is not None else row.submitted_at,
            mean_util=mean_util,
            idle_s=min(max(idle_s, 0.0), held),
        )
    )
    return gpu_s
