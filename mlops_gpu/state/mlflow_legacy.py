"""How stores before schema v12 recorded MLflow runs, read only by the migrations that need it.

Before v12 an attempt's MLflow run was an event: ``mlflow_run`` at launch with the MLflow run
id as its reason text (or a placeholder ``pending:RUN:ATTEMPT`` while the run was not made
yet), and ``mlflow_closed`` with the same text once MLflow took the close. The v5 step notes
old attempts closed in that form; the v12 step copies these events into the ``mlflow_runs``
table (``state.mlflow_notes``), which every reader and writer uses since. Nothing else reads
the events' text: a released migration step must keep doing what it did, so its reader lives
here, frozen, and not in the module that moved on.

Invariants: reads only; the same answers as the v11 store's own reader for the same events
(a close note matched within its run, where that reader matched it store-wide: an MLflow run
belongs to one run).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import Connection, select

from mlops_gpu.model import Phase
from mlops_gpu.state.bulk import CHUNK
from mlops_gpu.state.schema import events, runs

OPENED, CLOSED = "mlflow_run", "mlflow_closed"
#: The placeholder text of an attempt's MLflow run not made yet (``pending:RUN:ATTEMPT``).
PENDING_PREFIX = "pending:"


@dataclass(frozen=True, slots=True)
class NotedRun:
    """One MLflow run an attempt noted (the text of its ``mlflow_run`` events)."""

    run_id: str
    attempt: int
    text: str
    opened_at: float
    closed_at: float | None


def noted(conn: Connection) -> dict[tuple[str, int], list[NotedRun]]:
    """Every attempt's noted MLflow runs, in the order the old reader saw them (an id noted
    again counts where it was noted last: the submitter's run, adopted by each launch)."""
    opened: dict[tuple[str, int], list[tuple[str, float]]] = {}
    closed: dict[tuple[str, str], float] = {}
    q = (
        select(events.c.run_id, events.c.attempt, events.c.kind, events.c.reason, events.c.time)
        .where(events.c.kind.in_((OPENED, CLOSED)))
        .order_by(events.c.id)
    )
    for r in conn.execute(q):
        if r.kind == OPENED:
            opened.setdefault((r.run_id, r.attempt), []).append((r.reason, r.time))
        else:
            closed.setdefault((r.run_id, r.reason), r.time)
    out: dict[tuple[str, int], list[NotedRun]] = {}
    for (rid, attempt), notes in opened.items():
        first: dict[str, float] = {}
        for text, at in notes:
            first.setdefault(text, at)
        ids = list(dict.fromkeys(text for text, _ in reversed(notes)))[::-1]
        out[(rid, attempt)] = [
            NotedRun(rid, attempt, m, first[m], closed.get((rid, m))) for m in ids
        ]
    return out


def unclosed_ids(conn: Connection, active: Collection[Phase]) -> list[tuple[str, int, str]]:
    """(run id, attempt, text) of the noted MLflow runs never noted closed whose attempt is
    over, as the v11 store found them (the v5 step notes these closed)."""
    out: list[tuple[str, int, str]] = []
    last: dict[tuple[str, int], str] = {}
    for key, notes in noted(conn).items():
        out += [(*key, n.text) for n in notes[:-1] if n.closed_at is None]
        if notes[-1].closed_at is None:
            last[key] = notes[-1].text
    if last:
        # only the columns every version since v1 has: this runs inside old migration steps
        ids = sorted({k[0] for k in last})
        live: dict[str, tuple[int, Phase]] = {}
        for i in range(0, len(ids), CHUNK):
            q = select(runs.c.id, runs.c.attempt, runs.c.phase).where(
                runs.c.id.in_(ids[i : i + CHUNK])
            )
            live.update((r.id, (r.attempt, Phase(r.phase))) for r in conn.execute(q))
        out += [
            (*k, m) for k, m in sorted(last.items())
            if not (k[0] in live and live[k[0]][0] == k[1] and live[k[0]][1] in active)
        ]  # fmt: skip
    return out
