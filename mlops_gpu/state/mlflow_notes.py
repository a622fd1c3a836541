"""The store's record of each attempt's MLflow runs (table ``mlflow_runs``): written by the
controller and the tracking worker (``apply``), read by a scheduler's start (``unclosed``), the
SDK (``Run.mlflow_run_id``) and the dashboard (``links``).

At launch the controller notes the attempt's MLflow run (``opened``); a launch that did not wait
for MLflow notes a row without an MLflow run id (``opened(..., None)``), given its id once the
run is made (``made``); the tracking worker notes ``closed`` once MLflow took the close. An
MLflow run noted and not closed, whose attempt is over, ended while its close was still queued
(or the scheduler stopped first): ``unclosed`` returns it with its usage-ledger row, which was
written in the transaction that ended the attempt, so the close can be made from the store.

For people reading a run's history each note also appends an event (``mlflow_run``,
``mlflow_closed``) that says it in words; nothing reads those events back.

Invariants:
- An attempt's rows are in the order noted (``id``); one noted again moves to the end (the
  submitter's MLflow run, adopted by each launch of the first attempt), so the attempt's last
  row is its latest launch's and every earlier row a launch that failed and was tried again.
- An attempt has at most one open row without an MLflow run id (a second launch that did not
  wait reuses it; ``made`` fills it, oldest first).
- ``unclosed`` returns only attempts that are over (the run has moved on to a later attempt,
  or is no longer in an active phase, or the row is a failed launch's); a running attempt's
  MLflow run never is.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Connection, Row, bindparam, func, select

from mlops_gpu.model import Phase
from mlops_gpu.state.bulk import CHUNK, rows_of
from mlops_gpu.state.schema import events, mlflow_runs, usage

#: The events that say, in words, what the notes record.
OPENED_EVENT, CLOSED_EVENT = "mlflow_run", "mlflow_closed"


@dataclass(frozen=True, slots=True)
class MlflowNote:
    """One change to an attempt's MLflow runs. ``opened``: a launch made or adopted the MLflow
    run ``mlflow_run_id`` (None: the launch went on before it was made); ``made``: the run of
    the attempt's open row without an id was made after its launch; ``closed``: MLflow took
    the close of ``mlflow_run_id`` (None: of the row without an id, no run was ever made)."""

    run_id: str
    attempt: int
    op: Literal["opened", "made", "closed"]
    mlflow_run_id: str | None = None


@dataclass(frozen=True, slots=True)
class MlflowLink:
    """A row of ``mlflow_runs``: one MLflow run of one attempt of a run."""

    run_id: str
    attempt: int
    mlflow_run_id: str | None
    opened_at: float
    closed_at: float | None


@dataclass(frozen=True, slots=True)
class UnclosedMlflowRun:
    """An attempt that is over, whose MLflow run was never closed (``mlflow_run_id`` None: its
    launch went on before the run was made, and it never was); the ledger's figures when the
    attempt held GPUs (``outcome`` None: it never did, e.g. its launch failed)."""

    run_id: str
    attempt: int
    mlflow_run_id: str | None
    outcome: str | None = None
    gpu_type: str = ""
    start: float = 0.0
    end: float = 0.0
    gpu_seconds: float = 0.0
    queued_at: float | None = None
    mean_util: float | None = None
    #: A preempted attempt: the work its preemption threw away (its ``preempting`` event).
    lost_gpu_s: float | None = None


@dataclass
class _Row:
    id: int | None  # None: not written yet
    mlflow_run_id: str | None
    opened_at: float
    closed_at: float | None
    changed: bool = field(default=False)


def _read(conn: Connection, run_ids: Sequence[str]) -> dict[tuple[str, int], list[_Row]]:
    out: dict[tuple[str, int], list[_Row]] = {}
    for i in range(0, len(run_ids), CHUNK):
        q = (
            select(mlflow_runs)
            .where(mlflow_runs.c.run_id.in_(list(run_ids[i : i + CHUNK])))
            .order_by(mlflow_runs.c.id)
        )
        for r in conn.execute(q):
            row = _Row(r.id, r.mlflow_run_id, r.opened_at, r.closed_at)
            out.setdefault((r.run_id, r.attempt), []).append(row)
    return out


def _find(rows: list[_Row], mlflow_id: str | None) -> int | None:
    for i, r in enumerate(rows):
        if r.mlflow_run_id == mlflow_id and (mlflow_id is not None or r.closed_at is None):
            return i
    return None


def _said(n: MlflowNote) -> tuple[str, str]:
    """The event that says ``n`` in words: (kind, reason)."""
    m = n.mlflow_run_id
    if n.op == "opened" and m is None:
        return OPENED_EVENT, "MLflow run not made yet: the launch did not wait for MLflow"
    if n.op == "opened":
        return OPENED_EVENT, f"MLflow run {m} opened"
    if n.op == "made":
        return OPENED_EVENT, f"MLflow run {m} made after the launch"
    return CLOSED_EVENT, (f"MLflow run {m} closed" if m is not None else
                          "no MLflow run was made for this launch: none to close")  # fmt: skip


def apply(conn: Connection, notes: Sequence[MlflowNote], now: float) -> None:
    """Write ``notes``, in order, in the caller's transaction: one read of the runs' rows, then
    batched deletes, updates and inserts, and one batched insert of their events."""
    if not notes:
        return
    have = _read(conn, sorted({n.run_id for n in notes}))
    gone: list[int] = []
    said: list[dict[str, object]] = []
    for n in notes:
        rows = have.setdefault((n.run_id, n.attempt), [])
        if n.op == "made":
            pending = _find(rows, None)
            if pending is not None:
                rows[pending].mlflow_run_id, rows[pending].changed = n.mlflow_run_id, True
            elif _find(rows, n.mlflow_run_id) is None:
                rows.append(_Row(None, n.mlflow_run_id, now, None))
        elif n.op == "opened":
            at = _find(rows, n.mlflow_run_id)
            if at is None:
                rows.append(_Row(None, n.mlflow_run_id, now, None))
            elif at != len(rows) - 1:  # noted again: it is the attempt's latest launch's now
                old = rows.pop(at)
                if old.id is not None:
                    gone.append(old.id)
                rows.append(_Row(None, old.mlflow_run_id, old.opened_at, old.closed_at))
        else:
            hit = [r for r in rows if r.mlflow_run_id == n.mlflow_run_id and r.closed_at is None]
            for r in hit:
                r.closed_at, r.changed = now, True
            if not hit:
                continue  # (nothing noted for it: nothing to say)
        kind, reason = _said(n)
        said.append({"run_id": n.run_id, "time": now, "kind": kind, "phase_from": None,
                     "phase_to": None, "attempt": n.attempt, "reason": reason})  # fmt: skip
    for i in range(0, len(gone), CHUNK):
        conn.execute(mlflow_runs.delete().where(mlflow_runs.c.id.in_(gone[i : i + CHUNK])))
    changed = [
        {"rid": r.id, "m": r.mlflow_run_id, "closed": r.closed_at}
        for rows in have.values()
        for r in rows
        if r.id is not None and r.changed
    ]
    if changed:
        conn.execute(
            mlflow_runs.update()
            .where(mlflow_runs.c.id == bindparam("rid"))
            .values(mlflow_run_id=bindparam("m"), closed_at=bindparam("closed")),
            changed,
        )
    new = [
        {"run_id": rid, "attempt": attempt, "mlflow_run_id": r.mlflow_run_id,
         "opened_at": r.opened_at, "closed_at": r.closed_at}
        for (rid, attempt), rows in have.items()
        for r in rows
        if r.id is None
    ]  # fmt: skip
    if new:
        conn.execute(mlflow_runs.insert(), new)
    if said:
        conn.execute(events.insert(), said)


def links(conn: Connection, run_ids: Sequence[str]) -> dict[str, list[MlflowLink]]:
    """Each of ``run_ids``' MLflow runs, attempt by attempt in the order noted (runs with none
    are left out)."""
    out: dict[str, list[MlflowLink]] = {}
    for (rid, attempt), rows in _read(conn, list(run_ids)).items():
        out.setdefault(rid, []).extend(
            MlflowLink(rid, attempt, r.mlflow_run_id, r.opened_at, r.closed_at) for r in rows
        )
    for found in out.values():
        found.sort(key=lambda link: link.attempt)  # (stable: each attempt's order kept)
    return out


def unclosed(conn: Connection, active: Collection[Phase]) -> list[UnclosedMlflowRun]:
    open_rows = conn.execute(
        select(mlflow_runs).where(mlflow_runs.c.closed_at.is_(None)).order_by(mlflow_runs.c.id)
    ).all()
    if not open_rows:
        return []
    run_ids = sorted({r.run_id for r in open_rows})
    last_id: dict[tuple[str, int], int] = {}
    for i in range(0, len(run_ids), CHUNK):
        q = (
            select(mlflow_runs.c.run_id, mlflow_runs.c.attempt, func.max(mlflow_runs.c.id))
            .where(mlflow_runs.c.run_id.in_(run_ids[i : i + CHUNK]))
            .group_by(mlflow_runs.c.run_id, mlflow_runs.c.attempt)
        )
        last_id.update(((rid, attempt), int(top)) for rid, attempt, top in conn.execute(q))
    out: list[UnclosedMlflowRun] = []
    last: dict[tuple[str, int], str | None] = {}
    for r in open_rows:
        # a launch that failed is rolled back and the attempt launched again under the same
        # number: every MLflow run of an attempt but its last never held GPUs
        if r.id == last_id[(r.run_id, r.attempt)]:
            last[(r.run_id, r.attempt)] = r.mlflow_run_id
        else:
            out.append(UnclosedMlflowRun(r.run_id, r.attempt, r.mlflow_run_id))
    if not last:
        return out
    live = {
        r.id: (r.attempt, Phase(r.phase))
        for r in rows_of(conn, sorted({k[0] for k in last})).values()
    }
    over = {
        k: v for k, v in last.items() if not (live[k[0]][0] == k[1] and live[k[0]][1] in active)
    }
    ledger: dict[tuple[str, int], Row[Any]] = {}
    over_ids = sorted({rid for rid, _ in over})
    for i in range(0, len(over_ids), CHUNK):
        for row in conn.execute(select(usage).where(usage.c.run_id.in_(over_ids[i : i + CHUNK]))):
            ledger[(row.run_id, row.attempt)] = row
    lost: dict[tuple[str, int], float | None] = {}
    preempted = sorted({k[0] for k, u in ledger.items() if u.outcome == "preempted"})
    for i in range(0, len(preempted), CHUNK):
        q = (
            select(events.c.run_id, events.c.attempt, events.c.lost_gpu_s)
            .where(events.c.kind == "preempting", events.c.run_id.in_(preempted[i : i + CHUNK]))
            .order_by(events.c.id)
        )
        for e in conn.execute(q):
            lost[(e.run_id, e.attempt)] = e.lost_gpu_s
    for (rid, attempt), mlflow_id in sorted(over.items()):
        u = ledger.get((rid, attempt))
        if u is None:
            out.append(UnclosedMlflowRun(rid, attempt, mlflow_id))
        else:
            out.append(UnclosedMlflowRun(rid, attempt, mlflow_id, u.outcome, u.gpu_type,
                                         u.start, u.end, u.gpu_seconds, u.queued_at,
                                         u.mean_util, lost.get((rid, attempt))))  # fmt: skip
    return out
