"""The ledger and event totals metrics show (``TotalsValue``: GPU-seconds and idle GPU-seconds
by project and GPU type, admission waits of ended attempts, admissions, requeues, work lost to
preemptions), kept between reads by ``Totals``.

Ledger rows and events are only ever added (never updated nor deleted), and a run's project
and class never change: the totals change exactly when the number of ledger rows or of counted
events does. ``Totals.read`` therefore first counts them (over indexes, without reading rows):
- unchanged: the totals kept are returned as they are (shared: readers must not change them);
- more rows: only the rows with ids above those already summed are read and added, if that
  accounts for every new row; else (a writer that took a lower id committed late) all is
  summed again by the database (GROUP BY). Sums added in Python may differ from the
  database's in the last bits of a float, never more.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Connection, case, func, select

from mlops_gpu.state.histogram import WAIT_BUCKETS, Histogram
from mlops_gpu.state.schema import events, runs, usage

#: the events the totals count (``_event_counts``)
COUNTED = ("admitted", "preempted", "lost", "preempting")
_WAIT = usage.c.start - func.coalesce(usage.c.queued_at, usage.c.start)


def _wait_histograms(conn: Connection) -> dict[tuple[str, str], Histogram]:
    wait = _WAIT
    cols = [func.sum(case((wait <= b, 1), else_=0)) for b in WAIT_BUCKETS]
    q = (
        select(usage.c.project, runs.c.priority, func.count(), func.sum(wait), *cols)
        .select_from(usage.join(runs, runs.c.id == usage.c.run_id))
        .group_by(usage.c.project, runs.c.priority)
    )
    out = {}
    for r in conn.execute(q):
        out[(r[0], r[1])] = Histogram(
            WAIT_BUCKETS, [int(x or 0) for x in r[4:]], int(r[2]), float(r[3] or 0.0)
        )
    return out


def _event_counts(
    conn: Connection,
) -> tuple[dict[str, int], dict[tuple[str, str], int], dict[str, float]]:
    j = events.join(runs, runs.c.id == events.c.run_id)
    admitted = {
        p: int(n)
        for p, n in conn.execute(
            select(runs.c.project, func.count())
            .select_from(j)
            .where(events.c.kind == "admitted")
            .group_by(runs.c.project)
        )
    }
    requeued = {
        (p, k): int(n)
        for p, k, n in conn.execute(
            select(runs.c.project, events.c.kind, func.count())
            .select_from(j)
            .where(events.c.kind.in_(("preempted", "lost")))
            .group_by(runs.c.project, events.c.kind)
        )
    }
    lost = {
        p: float(s or 0.0)
        for p, s in conn.execute(
            select(runs.c.project, func.sum(events.c.lost_gpu_s))
            .select_from(j)
            .where(events.c.kind == "preempting")
            .group_by(runs.c.project)
        )
    }
    return admitted, requeued, lost


class TotalsValue(NamedTuple):
    ledger: dict[tuple[str, str], tuple[float, float]]
    ended_waits: dict[tuple[str, str], Histogram]
    admitted: dict[str, int]
    requeued: dict[tuple[str, str], int]
    lost_gpu_s: dict[str, float]


def _full(conn: Connection) -> TotalsValue:
    ledger = {
        (p, t): (float(g or 0.0), float(i or 0.0))
        for p, t, g, i in conn.execute(
            select(
                usage.c.project,
                usage.c.gpu_type,
                func.sum(usage.c.gpu_seconds),
                func.sum(usage.c.gpus * usage.c.idle_s),
            ).group_by(usage.c.project, usage.c.gpu_type)
        )
    }
    return TotalsValue(ledger, _wait_histograms(conn), *_event_counts(conn))


def _counts(conn: Connection) -> tuple[int, int, int, int]:
    """(ledger rows, their newest id, counted events, their newest id), in one statement."""
    counted = events.c.kind.in_(COUNTED)
    q = select(
        select(func.count()).select_from(usage).scalar_subquery(),
        select(func.max(usage.c.id)).scalar_subquery(),
        select(func.count()).select_from(events).where(counted).scalar_subquery(),
        select(func.max(events.c.id)).where(counted).scalar_subquery(),
    )
    n_u, id_u, n_e, id_e = conn.execute(q).one()
    return int(n_u), int(id_u or 0), int(n_e), int(id_e or 0)


class Totals:
    """The totals of one store, kept between reads (module docstring)."""

    def __init__(self) -> None:
        self.value: TotalsValue | None = None
        #: (ledger rows, newest ledger id, counted events, newest counted event id) summed
        self._at = (0, 0, 0, 0)
        #: full sums by the database so far (for tests and the benchmark's curiosity)
        self.full_reads = 0

    def read(self, conn: Connection) -> TotalsValue:
        n_u, _id_u, n_e, _id_e = now = _counts(conn)
        old, (o_nu, o_idu, o_ne, o_ide) = self.value, self._at
        if old is not None and (n_u, n_e) == (o_nu, o_ne):
            return old
        if old is not None and n_u >= o_nu and n_e >= o_ne:
            new = self._added(conn, old, o_idu, o_ide, n_u - o_nu, n_e - o_ne)
            if new is not None:
                self.value, self._at = new, now
                return new
        # (the rows summed are read after their counts: they may hold more, never fewer; the
        # next read then finds the counts off and sums again)
        self.value, self._at = _full(conn), now
        self.full_reads += 1
        return self.value

    @staticmethod
    def _added(
        conn: Connection, old: TotalsValue, after_u: int, after_e: int, want_u: int, want_e: int
    ) -> TotalsValue | None:
        """``old`` plus the rows after the ids summed, or None where they are not exactly the
        rows counted since (a lower id committed late, or rows committed since the count)."""
        uq = (
            select(
                usage.c.project,
                usage.c.gpu_type,
                usage.c.gpu_seconds,
                usage.c.gpus * usage.c.idle_s,
                _WAIT,
                runs.c.priority,
            )
            .select_from(usage.join(runs, runs.c.id == usage.c.run_id))
            .where(usage.c.id > after_u)
        )
        eq = (
            select(runs.c.project, events.c.kind, events.c.lost_gpu_s)
            .select_from(events.join(runs, runs.c.id == events.c.run_id))
            .where(events.c.id > after_e, events.c.kind.in_(COUNTED))
        )
        u_rows, e_rows = conn.execute(uq).all(), conn.execute(eq).all()
        if len(u_rows) != want_u or len(e_rows) != want_e:
            return None
        ledger, waits = dict(old.ledger), dict(old.ended_waits)
        for p, t, g, idle, wait, prio in u_rows:
            g0, i0 = ledger.get((p, t), (0.0, 0.0))
            ledger[(p, t)] = (g0 + float(g or 0.0), i0 + float(idle or 0.0))
            h = waits.get((p, prio))
            h = Histogram(WAIT_BUCKETS, list(h.buckets), h.count, h.sum) if h else None
            h = waits[(p, prio)] = h or Histogram(WAIT_BUCKETS)
            h.observe(float(wait or 0.0))
        admitted, requeued, lost = dict(old.admitted), dict(old.requeued), dict(old.lost_gpu_s)
        for p, kind, lost_s in e_rows:
            if kind == "admitted":
                admitted[p] = admitted.get(p, 0) + 1
            elif kind == "preempting":
                lost[p] = lost.get(p, 0.0) + float(lost_s or 0.0)
            else:
                requeued[(p, kind)] = requeued.get((p, kind), 0) + 1
        return TotalsValue(ledger, waits, admitted, requeued, lost)
