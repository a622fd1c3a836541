"""The store's record of which attempts' MLflow runs were closed, read at a scheduler's start.

At launch the controller notes the attempt's MLflow run (event ``mlflow_run``, the MLflow run
id as its text); the tracking worker notes ``mlflow_closed`` (same text) once MLflow took the
close. An MLflow run noted opened and not closed, whose attempt is over, ended while its close
was still queued (or the scheduler stopped first): ``unclosed`` returns it with its usage-ledger
row, which was written in the transaction that ended the attempt, so the close can be made from
the store.

Invariants: only attempts that are over are returned (the run has moved on to a later attempt,
or is no longer in an active phase, or the MLflow run was an attempt's launch that failed and
was tried again under the same attempt number); a running attempt's MLflow run never is.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, select

from mlops_gpu.model import Phase
from mlops_gpu.state.bulk import CHUNK, rows_of
from mlops_gpu.state.schema import events, usage

OPENED, CLOSED = "mlflow_run", "mlflow_closed"


@dataclass(frozen=True, slots=True)
class UnclosedMlflowRun:
    """An attempt that is over, whose MLflow run was never closed; the ledger's figures when the
    attempt held GPUs (``outcome`` None: it never did, e.g. its launch failed)."""

    run_id: str
    attempt: int
    mlflow_run_id: str
    outcome: str | None = None
    gpu_type: str = ""
    start: float = 0.0
    end: float = 0.0
    gpu_seconds: float = 0.0
    queued_at: float | None = None
    mean_util: float | None = None
    #: A preempted attempt: the work its preemption threw away (its ``preempting`` event).
    lost_gpu_s: float | None = None


def unclosed(
    conn: Connection, active: Collection[Phase], with_lost: bool = True
) -> list[UnclosedMlflowRun]:
    """``with_lost``: read preempted attempts' ``lost_gpu_s`` (False for a store migrated from
    before v7, which lacks the column)."""
    opened: dict[tuple[str, int], list[str]] = {}  # in the order noted
    closed: set[str] = set()
    q = (
        select(events.c.run_id, events.c.attempt, events.c.kind, events.c.reason)
        .where(events.c.kind.in_((OPENED, CLOSED)))
        .order_by(events.c.id)
    )
    for r in conn.execute(q):
        if r.kind == OPENED:
            opened.setdefault((r.run_id, r.attempt), []).append(r.reason)
        else:
            closed.add(r.reason)
    out: list[UnclosedMlflowRun] = []
    last: dict[tuple[str, int], str] = {}
    for (rid, attempt), noted in opened.items():
        # (an id noted again is the same MLflow run: the submitter's, adopted by each launch)
        ids = list(dict.fromkeys(reversed(noted)))[::-1]
        # a launch that failed is rolled back and the attempt launched again under the same
        # number: every MLflow run of an attempt but its last never held GPUs
        out += [UnclosedMlflowRun(rid, attempt, m) for m in ids[:-1] if m not in closed]
        if ids[-1] not in closed:
            last[(rid, attempt)] = ids[-1]
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
    for i in range(0, len(preempted) if with_lost else 0, CHUNK):
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


def note_rows(rows: Sequence[tuple[str, int, str, str]], now: float) -> list[dict[str, object]]:
    """``events`` rows for notes (run id, attempt, kind, text) that change nothing else."""
    return [
        {"run_id": rid, "time": now, "kind": kind, "phase_from": None, "phase_to": None,
         "attempt": attempt, "reason": text}
        for rid, attempt, kind, text in rows
    ]  # fmt: skip
