"""Reads of the web dashboard beyond the shared views: GPU time per project per UTC day from
the usage ledger (the Costs page), per-run notes (the Runs page: the MLflow run of the latest
launch, from ``mlflow_runs``; the GPU-seconds of work preemptions threw away, from the
events), and ``live``: the part of ``observed.read`` the Cluster, Projects and Costs pages
show.

Invariants: reads only; each read is bounded by its arguments (a time window, a page of run
ids), never by the whole store.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from sqlalchemy import Integer, cast, func, select

from mlops_gpu.model import Phase
from mlops_gpu.state import mlflow_notes, observed
from mlops_gpu.state.schema import events, runs, usage
from mlops_gpu.state.store import Store

DAY_S = 86_400.0
#: The events that note the work a preemption lost.
PREEMPTING = "preempting"


@dataclass(frozen=True)
class DayUsage:
    """One project's ended attempts of one GPU type on one UTC day (by the day they ended)."""

    project: str
    gpu_type: str
    day: float  # the day's start (epoch seconds, UTC midnight)
    attempts: int
    gpu_s: float
    #: GPU-seconds held idle past the idle window (``gpus * idle_s`` of each attempt)
    idle_gpu_s: float


def daily_usage(
    store: Store, since: float, projects: Collection[str] | None = None
) -> list[DayUsage]:
    """Ended attempts that ended at or after ``since``, summed per (project, GPU type, UTC
    day), by day then project then type. Summed by the database (20,000 ledger rows a page
    would otherwise cross the driver one by one)."""
    # the day's number: SQLite's CAST truncates (the same as floor for times after 1970),
    # PostgreSQL's rounds, so there it is floor()
    if store.engine.dialect.name == "sqlite":
        day = cast(usage.c.end / DAY_S, Integer)
    else:
        day = cast(func.floor(usage.c.end / DAY_S), Integer)
    q = (
        select(usage.c.project, usage.c.gpu_type, day, func.count(),
               func.sum(usage.c.gpu_seconds), func.sum(usage.c.gpus * usage.c.idle_s))
        .where(usage.c.end >= since)
        .group_by(usage.c.project, usage.c.gpu_type, day)
    )  # fmt: skip
    if projects is not None:
        q = q.where(usage.c.project.in_(sorted(projects)))
    with store._ro() as conn:
        out = [
            DayUsage(str(p), str(t), float(d) * DAY_S, int(n), float(g or 0.0), float(i or 0.0))
            for p, t, d, n, g, i in conn.execute(q)
        ]
    return sorted(out, key=lambda r: (r.day, r.project, r.gpu_type))


@dataclass(frozen=True)
class RunNotes:
    #: The MLflow run of the run's latest launch that has one (latest attempt first), or None.
    mlflow_run_id: str | None
    #: GPU-seconds of work thrown away by the run's preemptions, over all attempts.
    lost_gpu_s: float
    preemptions: int


def run_notes(store: Store, run_ids: Sequence[str]) -> dict[str, RunNotes]:
    """Notes of each of ``run_ids`` (a page: a few dozen)."""
    if not run_ids:
        return {}
    mlflow: dict[str, str] = {}
    lost: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    q = (
        select(events.c.run_id, events.c.lost_gpu_s)
        .where(events.c.run_id.in_(list(run_ids)), events.c.kind == PREEMPTING)
        .order_by(events.c.id)
    )
    with store._ro() as conn:
        for run_id, found in mlflow_notes.links(conn, run_ids).items():
            made = [link.mlflow_run_id for link in found if link.mlflow_run_id is not None]
            if made:
                mlflow[run_id] = made[-1]
        for run_id, lost_s in conn.execute(q):
            lost[run_id] += float(lost_s or 0.0)
            count[run_id] += 1
    return {
        r: RunNotes(mlflow.get(r), lost.get(r, 0.0), count.get(r, 0))
        for r in run_ids
        if r in mlflow or r in count
    }


def live(store: Store, feed: observed.ActiveFeed, with_pending: bool = False) -> observed.Observed:
    """What the dashboard's Cluster, Projects and Costs pages read from the store in one
    read-only transaction: the runs holding GPUs (``feed``, brought up to date: only the runs
    changed since its last read), the launchers' GPU samples, and with ``with_pending`` the
    pending runs counted by (project, class, reason code). The ledger's and the events'
    aggregates the metrics need are left out (empty): no page shows them."""
    with store.engine.connect().execution_options(readonly=True) as conn, conn.begin():
        pending: dict[tuple[str, str, str], int] = {}
        if with_pending:
            q = (
                select(runs.c.project, runs.c.priority, runs.c.reason_code, func.count())
                .where(runs.c.phase == Phase.PENDING.value)
                .group_by(runs.c.project, runs.c.priority, runs.c.reason_code)
            )
            pending = {(p, c, code or ""): int(n) for p, c, code, n in conn.execute(q)}
        active = feed.refresh(conn)
        # through the driver's own cursor (as ``observed.read``): SQLAlchemy's row processing
        # cost more than the query for 8,000 rows
        cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute("SELECT node, device, run_id, utilization_pct, memory_used_mb, at "
                        "FROM gpu_samples")  # fmt: skip
            samples = [observed.GpuSample(*r) for r in cur.fetchall()]
        finally:
            cur.close()
    return observed.Observed(pending, active, {}, {}, {}, {}, {}, samples, None)
