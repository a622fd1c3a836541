"""What metrics scrapes and ``mlops-gpu top`` read from the store, and the two things only the
scheduler process knows that it publishes there for them (schema v8).

Published by the scheduler (the leader; other processes only read):
- ``scheduler_cycles``: its cycle-latency histogram, cumulative since it started, rewritten with
  its heartbeat (at most every ``heartbeat.BEAT_S``). Buckets are ``CYCLE_BUCKETS``.
- ``gpu_samples``: the last sample of each device a running run's launcher reported (its
  telemetry file), replaced as a whole whenever the set of samples changed.

Read in one read-only transaction (``read``): aggregates computed by the database (GROUP BY),
never one row per pending run, so a scrape's cost grows with projects, classes, nodes and
running runs, not with the queue. A reader that keeps an ``ActiveFeed`` between reads reads
only the active runs changed since, and the ledger and event totals only when they changed.

Invariants:
- These writes never raise the store revision: publishing metrics does not wake the scheduler.
- Counts read here are monotonic where the metric is a counter: events and ledger rows are only
  ever added; an admission's wait is counted from its admission on (active attempts from the
  runs table, ended ones from the ledger: each attempt once).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, func, select

from mlops_gpu.model import ACTIVE_PHASES, Phase
from mlops_gpu.state.histogram import CYCLE_BUCKETS as CYCLE_BUCKETS
from mlops_gpu.state.histogram import WAIT_BUCKETS as WAIT_BUCKETS
from mlops_gpu.state.histogram import Histogram as Histogram
from mlops_gpu.state.schema import (
    gpu_samples,
    revision,
    runs,
    scheduler_cycles,
)
from mlops_gpu.state.store import Store
from mlops_gpu.state.totals import Totals

_ID = 1


class GpuSample(NamedTuple):  # (a tuple: 8,000 of them are read per scrape)
    node: str
    device: str
    run_id: str
    utilization_pct: float | None
    memory_used_mb: float | None
    at: float


@dataclass(frozen=True, slots=True)
class ActiveRow:
    """An attempt holding GPUs (admitted, starting or running): just what metrics need."""

    id: str
    name: str
    project: str
    user: str
    priority: str
    phase: str
    placement: str | None  # the stored JSON (``Placement.to_dict``)
    admitted_at: float | None
    queued_at: float | None


@dataclass
class Observed:
    """One consistent read of everything the metrics and ``top`` show from the store."""

    #: (project, priority, reason_code or "") -> pending runs
    pending: dict[tuple[str, str, str], int]
    active: list[ActiveRow]
    #: (project, gpu_type) -> (GPU-seconds booked, idle GPU-seconds booked) by ended attempts
    ledger: dict[tuple[str, str], tuple[float, float]]
    #: (project, priority) -> waits of ended attempts (``WAIT_BUCKETS``)
    ended_waits: dict[tuple[str, str], Histogram]
    #: project -> admissions (events ``admitted``)
    admitted: dict[str, int]
    #: (project, kind) -> attempts ended ``preempted`` or ``lost``
    requeued: dict[tuple[str, str], int]
    #: project -> GPU-seconds of work preemptions threw away
    lost_gpu_s: dict[str, float]
    samples: list[GpuSample]
    cycles: Histogram | None


def publish_cycles(store: Store, hist: Histogram, now: float | None = None) -> None:
    """The scheduler's histogram so far (it holds the leader lock; one row, replaced)."""
    row = dict(
        pid=os.getpid(),
        count=hist.count,
        sum_s=hist.sum,
        buckets=json.dumps(hist.buckets),
        at=time.time() if now is None else now,
    )
    with store.engine.begin() as conn:
        conn.execute(scheduler_cycles.delete())
        conn.execute(scheduler_cycles.insert().values(id=_ID, **row))


def publish_samples(store: Store, samples: Iterable[GpuSample]) -> None:
    """Replace every stored GPU sample with ``samples`` (one per (node, device))."""
    rows = {(s.node, s.device): s for s in samples}
    with store.engine.begin() as conn:
        conn.execute(gpu_samples.delete())
        if rows:
            conn.execute(
                gpu_samples.insert(),
                [
                    {
                        "node": s.node,
                        "device": s.device,
                        "run_id": s.run_id,
                        "utilization_pct": s.utilization_pct,
                        "memory_used_mb": s.memory_used_mb,
                        "at": s.at,
                    }
                    for s in rows.values()
                ],
            )


class ActiveFeed:
    """The runs holding GPUs, kept between reads: the first read takes them all, later ones
    only the runs changed since (their ``rev`` above the revision last read), as the
    scheduler's own mirror follows the store. Every change to an active run's fields read
    here raises the revision (``Store``), so nothing is missed.

    It also keeps the ledger and event totals (``state.totals``: only rows added since are
    read) and the GPU samples. The totals (and the samples list, while the samples are
    unchanged) are shared between ``Observed`` reads: readers must not change them."""

    _COLS = (runs.c.id, runs.c.name, runs.c.project, runs.c.user, runs.c.priority,
             runs.c.phase, runs.c.placement, runs.c.admitted_at, runs.c.queued_at)  # fmt: skip

    def __init__(self) -> None:
        self.rev: int | None = None
        self.rows: dict[str, ActiveRow] = {}
        #: rises whenever ``rows`` changed (a revision that moved only pending runs keeps it)
        self.generation = 0
        #: the ledger and event totals, kept between reads (``state.totals``)
        self.totals = Totals()
        #: the GPU samples last read, as the driver returned them and as ``GpuSample``s
        self.samples_raw: list[Any] | None = None
        self.samples: list[GpuSample] = []

    def refresh(self, conn: Connection) -> list[ActiveRow]:
        # the revision first: under READ COMMITTED the rows may then be newer, never older
        rev = int(conn.execute(select(revision.c.value)).scalar_one())
        live = {p.value for p in ACTIVE_PHASES}
        if self.rev is None:
            q = select(*self._COLS).where(runs.c.phase.in_(live)).order_by(runs.c.seq)
            self.rows = {r.id: ActiveRow(*r) for r in conn.execute(q)}
            self.generation += 1
        elif rev != self.rev:
            q = select(*self._COLS).where(runs.c.rev > self.rev).order_by(runs.c.rev)
            for r in conn.execute(q):
                if r.phase in live:
                    row = ActiveRow(*r)
                    if self.rows.get(r.id) != row:
                        self.rows[r.id] = row
                        self.generation += 1
                elif self.rows.pop(r.id, None) is not None:
                    self.generation += 1
        self.rev = rev
        return list(self.rows.values())


def read(store: Store, feed: ActiveFeed | None = None) -> Observed:
    """Everything ``Observed`` holds, in one read-only transaction (``feed``: the active runs
    kept from earlier reads, brought up to date; without one they are all read)."""
    with store.engine.connect().execution_options(readonly=True) as conn, conn.begin():
        pending = {
            (p, prio, code or ""): int(n)
            for p, prio, code, n in conn.execute(
                select(runs.c.project, runs.c.priority, runs.c.reason_code, func.count())
                .where(runs.c.phase == Phase.PENDING.value)
                .group_by(runs.c.project, runs.c.priority, runs.c.reason_code)
            )
        }
        feed = feed or ActiveFeed()
        active = feed.refresh(conn)
        totals = feed.totals.read(conn)
        # through the driver's own cursor: SQLAlchemy's row processing cost more than the
        # query for 8,000 rows
        cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute("SELECT node, device, run_id, utilization_pct, memory_used_mb, at "
                        "FROM gpu_samples ORDER BY node, device")  # fmt: skip
            raw = list(cur.fetchall())
            if raw != feed.samples_raw:  # (else the same list: unchanged since the last read)
                feed.samples_raw, feed.samples = raw, [GpuSample(*r) for r in raw]
            samples = feed.samples
        finally:
            cur.close()
        row = conn.execute(select(scheduler_cycles).where(scheduler_cycles.c.id == _ID)).first()
    cycles = None
    if row is not None:
        m = row._mapping  # (``row.count`` is the tuple method)
        cycles = Histogram(
            CYCLE_BUCKETS, _buckets(m["buckets"]), int(m["count"]), float(m["sum_s"])
        )
    return Observed(pending, active, *totals, samples, cycles)


def _buckets(raw: str) -> list[int]:
    """The stored bucket counts, or zeros if they do not match ``CYCLE_BUCKETS`` (a row left
    by a version with other buckets)."""
    try:
        vals = json.loads(raw)
    except ValueError:
        vals = None
    if not isinstance(vals, list) or len(vals) != len(CYCLE_BUCKETS):
        return [0] * len(CYCLE_BUCKETS)
    return [int(v) for v in vals]


def pending_head(
    store: Store, limit: int, order: Mapping[str, int], projects: Iterable[str] | None = None
) -> list[Any]:
    """The first ``limit`` pending runs (of ``projects`` only, if given), highest class
    (``order``: class -> value) then oldest first: (id, name, project, priority, reason_code,
    reason, eta, submitted_at) rows. Reads ``limit`` rows per class at most, not the whole
    queue."""
    mine = runs.c.phase == Phase.PENDING.value
    if projects is not None:
        mine = mine & runs.c.project.in_(sorted(projects))
    cols = (
        runs.c.id,
        runs.c.name,
        runs.c.project,
        runs.c.priority,
        runs.c.reason_code,
        runs.c.reason,
        runs.c.eta,
        runs.c.submitted_at,
    )
    with store.engine.connect().execution_options(readonly=True) as conn, conn.begin():
        classes = [c for (c,) in conn.execute(select(runs.c.priority).where(mine).distinct())]
        out: list[Any] = []
        for c in sorted(classes, key=lambda c: -order.get(c, 0)):
            q = (
                select(*cols)
                .where(mine, runs.c.priority == c)
                .order_by(runs.c.submitted_at, runs.c.seq)
                .limit(limit)
            )
            out.extend(conn.execute(q).all())
    out.sort(key=lambda r: (-order.get(r.priority, 0), r.submitted_at))
    return out[:limit]


def device_map(placement: Mapping[str, Any]) -> Sequence[tuple[str, str]]:
    """(node, device) of each device of a stored placement, in the launcher's order for a
    single-node run (its ``CUDA_VISIBLE_DEVICES``)."""
    return [(str(s["node"]), str(d)) for s in placement.get("slots", []) for d in s["devices"]]
