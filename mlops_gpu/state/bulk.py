"""Phase moves of many runs in one transaction with a constant number of statements: one read
of the rows, one revision bump, one batched UPDATE per shape of values, one batched INSERT of
the events. A scheduling cycle admits hundreds of runs; one statement round per run made the
store the slowest part of a large admission.

Invariants (the same as ``Store._move`` one run at a time): every move is a legal transition
(else ``ConflictError`` and nothing is written), every moved run gets the new revision and one
event; the caller's transaction makes it all or nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row, bindparam, select

from mlops_gpu.model import Phase
from mlops_gpu.model.phase import TERMINAL_PHASES, can_transition
from mlops_gpu.state.errors import ConflictError
from mlops_gpu.state.schema import events, revision, runs

CHUNK = 500  # ids per IN (...) list: well under every backend's bound-parameter limit


@dataclass
class Move:
    row: Row[Any]
    dst: Phase
    kind: str
    why: str
    values: dict[str, Any] = field(default_factory=dict)


def locked_rows(conn: Connection, run_ids: Sequence[str]) -> dict[str, Row[Any]]:
    """The rows of ``run_ids``, locked for update where the database locks; KeyError names the
    first id that is not in the store."""
    return rows_of(conn, run_ids, lock=True)


def rows_of(conn: Connection, run_ids: Sequence[str], lock: bool = False) -> dict[str, Row[Any]]:
    """The rows of ``run_ids`` (locked for update with ``lock``), read in chunks; KeyError
    names the first id that is not in the store."""
    out: dict[str, Row[Any]] = {}
    for i in range(0, len(run_ids), CHUNK):
        q = select(runs).where(runs.c.id.in_(list(run_ids[i : i + CHUNK])))
        out.update((r.id, r) for r in conn.execute(q.with_for_update() if lock else q))
    for run_id in run_ids:
        if run_id not in out:
            raise KeyError(run_id)
    return out


def bump(conn: Connection) -> int:
    """Raise the store revision (``schema.revision``) in this transaction; the new value."""
    stmt = revision.update().values(value=revision.c.value + 1).returning(revision.c.value)
    return int(conn.execute(stmt).scalar_one())


def move_many(conn: Connection, moves: Sequence[Move], now: float) -> None:
    """Each move compare-and-set: the row's phase to ``dst`` plus its values, and its event
    (``Store._move`` is this with one move)."""
    if not moves:
        return
    for m in moves:
        src = Phase(m.row.phase)
        if not can_transition(src, m.dst):
            raise ConflictError(f"run {m.row.id} is {src}; it cannot become {m.dst}")
    # A run that ends has no estimated start any more (a cancelled pending run kept the ETA
    # of its last explanation); a move that sets one itself keeps its own.
    moves = [
        Move(m.row, m.dst, m.kind, m.why, {"eta": None, **m.values})
        if m.dst in TERMINAL_PHASES and "eta" not in m.values
        else m
        for m in moves
    ]
    rev = bump(conn)
    shapes: dict[tuple[str, ...], list[Move]] = defaultdict(list)
    for m in moves:
        shapes[tuple(sorted(m.values))].append(m)
    for keys, group in shapes.items():
        # bind names must differ from the column names they set (SQLAlchemy reserves those)
        upd = (
            runs.update()
            .where(runs.c.id == bindparam("b_id"))
            .values(phase=bindparam("b_phase"), rev=rev, **{k: bindparam(f"b_{k}") for k in keys})
        )
        conn.execute(upd, [{"b_id": m.row.id, "b_phase": m.dst.value,
                            **{f"b_{k}": m.values[k] for k in keys}} for m in group])  # fmt: skip
    conn.execute(
        events.insert(),
        [
            {
                "run_id": m.row.id,
                "time": now,
                "kind": m.kind,
                "phase_from": m.row.phase,
                "phase_to": m.dst.value,
                "attempt": m.values.get("attempt", m.row.attempt),
                "reason": m.why,
            }
            for m in moves
        ],
    )
