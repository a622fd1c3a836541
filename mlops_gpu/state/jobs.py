"""Job control in the store: submits with arrays, dependencies and holds; hold and release;
cancelling the runs whose dependencies can never be met.

Invariants:
- One submit is one transaction (one revision): an array's elements all, or none, and the
  ``audit`` rows handed with it (the server's submits: a run stored is a run audited). Only a
  collision on ``runs.id`` draws new ids and tries again; any other integrity error (an audit
  row the store refuses) is ``WriteRefused`` at once, saying which rows.
- Array elements are ids ``<array-id>_<index>`` with the ``array_id`` column set; an array id
  is never a run id (it has no ``_``), so an id names a run or an array, never both.
- Dependencies are stored resolved to run ids: a dependency on an array id becomes one on each
  of its elements, ``after_names`` one ``afterany`` on each run of that name and user not ended
  at submit. An id that names neither a run nor an array refuses the whole submit
  (``DependencyError``). Since dependencies name runs that exist before the submit, and never
  change after it, they cannot form a cycle; ``_check_acyclic`` still refuses a batch that
  would.
- Hold and release change only pending runs; each is an event (``held``, ``released``) and a
  new revision, so the scheduler sees it at its next tick.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Row, select
from sqlalchemy.exc import IntegrityError

from mlops_gpu.model import TERMINAL_PHASES, Dependency, Phase, Run, RunSpec
from mlops_gpu.state.bulk import CHUNK, Move, bump, locked_rows, move_many
from mlops_gpu.state.errors import DependencyError, WriteRefused
from mlops_gpu.state.schema import audit as audit_table
from mlops_gpu.state.schema import events, runs

if TYPE_CHECKING:
    from mlops_gpu.state.store import Store

_ENDED = [p.value for p in TERMINAL_PHASES]


@dataclass(frozen=True, slots=True)
class JobControl:
    """What a submit asks beyond its specs."""

    #: Queue the runs held (``submit --hold``).
    held: bool = False
    #: The specs are the elements of one array (each with its ``array_index``).
    array: bool = False
    #: ``--after-name``: after every run of that name (and user) not ended at submit.
    after_names: tuple[str, ...] = ()


def _chunks(items: Sequence[str]) -> Iterable[list[str]]:
    for i in range(0, len(items), CHUNK):
        yield list(items[i : i + CHUNK])


def _resolve(conn: Connection, specs: Sequence[RunSpec], job: JobControl) -> list[RunSpec]:
    """The specs with their dependencies as run ids (see the module docstring)."""
    targets = sorted({d.run_id for s in specs for d in s.dependencies})
    known: dict[str, list[str]] = {}
    for part in _chunks(targets):
        for (rid,) in conn.execute(select(runs.c.id).where(runs.c.id.in_(part))):
            known[rid] = [rid]
    rest = [t for t in targets if t not in known]
    for part in _chunks(rest):
        q = select(runs.c.array_id, runs.c.id).where(runs.c.array_id.in_(part))
        for aid, rid in conn.execute(q.order_by(runs.c.seq)):
            known.setdefault(aid, []).append(rid)
    unknown = [t for t in targets if t not in known]
    if unknown:
        raise DependencyError(f"dependency on unknown run id {unknown[0]!r} (no run or array "
                              "has that id)")  # fmt: skip
    named: dict[tuple[str, str], list[str]] = {}
    for name in job.after_names:
        for user in {s.user for s in specs}:
            same = select(runs.c.id).where(
                runs.c.name == name, runs.c.user == user, runs.c.phase.not_in(_ENDED)
            )
            named[(name, user)] = [r for (r,) in conn.execute(same.order_by(runs.c.seq))]
    out = []
    for s in specs:
        deps: dict[tuple[str, str], Dependency] = {}
        for d in s.dependencies:
            for rid in known[d.run_id]:
                deps.setdefault((d.kind, rid), Dependency(d.kind, rid))
        for name in job.after_names:
            for rid in named[(name, s.user)]:
                deps.setdefault(("afterany", rid), Dependency("afterany", rid))
        out.append(replace(s, dependencies=tuple(deps.values())))
    return out


def _check_acyclic(ids: Sequence[str], specs: Sequence[RunSpec]) -> None:
    """Refuse a batch whose runs would wait for one another in a cycle (or for themselves)."""
    graph = {rid: [d.run_id for d in s.dependencies] for rid, s in zip(ids, specs, strict=True)}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for start in graph:
        stack = [(start, iter(graph[start]))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif nxt in graph and state.get(nxt) == 1:
                raise DependencyError(f"dependency cycle: run {nxt} would wait for itself")
            elif nxt in graph and nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(graph[nxt])))


def submit_runs(
    store: Store,
    specs: Sequence[RunSpec],
    now: float | None,
    job: JobControl | None = None,
    audit: Sequence[dict[str, Any] | None] | None = None,
) -> list[Run]:
    """Queue ``specs`` in one transaction (``Store.submit_many``), with ``job``'s controls and
    ``audit``'s rows (see ``Store.submit_many``)."""
    from mlops_gpu.state.base import _row_to_run, new_run_id

    if not specs:
        return []
    job = job or JobControl()
    now = time.time() if now is None else now
    for _ in range(5):
        step = "runs"  # where an IntegrityError came from: only the runs' ids are drawn again
        if job.array:
            aid = new_run_id()
            ids = [f"{aid}_{s.array_index}" for s in specs]
            final = [replace(s, array_id=aid) for s in specs]
        else:
            aid, ids, final = None, [new_run_id() for _ in specs], list(specs)
        if len(set(ids)) < len(ids):
            continue
        try:
            with store._tx() as conn:
                if any(s.dependencies for s in final) or job.after_names:
                    final = _resolve(conn, final, job)
                    _check_acyclic(ids, final)
                rows = _insert(conn, ids, final, now, job.held, aid)
                step = "audit"
                if audit is not None:
                    _audit(conn, ids, audit)
            break
        except IntegrityError as e:
            if step == "runs" and _id_collision(e):  # an id drawn twice: draw them all again
                continue
            # anything else (an audit row the store refuses) is no collision: retrying would
            # only fail again and be reported as one
            raise WriteRefused(f"submit refused by the store at its {step} rows (nothing was "
                              f"stored): {str(e.orig).splitlines()[0]}") from e  # fmt: skip
    else:  # pragma: no cover - 40 random bits colliding five times in a row
        raise RuntimeError("could not allocate unique run ids")
    # not through the store's run cache (``Store._run``): a server's API store submits runs it
    # never reads again, and 8,000 cached runs made the collector's full passes cost tens of
    # milliseconds of some request's latency (benchmarks/RESULTS.md, api_throughput.py)
    return [_row_to_run(row) for row in rows]


def _id_collision(e: IntegrityError) -> bool:
    """Whether ``e`` is the ``runs.id`` unique constraint: SQLite names the column
    ("UNIQUE constraint failed: runs.id"), PostgreSQL the constraint ("runs_id_key")."""
    text = str(e.orig)
    return "runs.id" in text or "runs_id_key" in text


def _audit(conn: Connection, ids: Sequence[str], rows: Sequence[dict[str, Any] | None]) -> None:
    if len(rows) != len(ids):
        raise ValueError(f"{len(rows)} audit rows for {len(ids)} runs")
    out = [{**row, "target": rid} for rid, row in zip(ids, rows, strict=True) if row is not None]
    if out:
        conn.execute(audit_table.insert(), out)


def _insert(
    conn: Connection,
    ids: Sequence[str],
    specs: Sequence[RunSpec],
    now: float,
    held: bool,
    array_id: str | None,
) -> Sequence[Row[Any]]:
    """Insert the runs and their ``submitted`` events; the runs' rows as stored, in the order
    of ``ids`` (``RETURNING``: read back in the same statement, not by a second query)."""
    rev = bump(conn)
    stored = conn.execute(
        runs.insert().returning(*runs.c, sort_by_parameter_order=True),
        [
            {
                "id": run_id,
                "name": spec.name,
                "project": spec.project,
                "user": spec.user,
                "priority": spec.priority,
                "phase": Phase.PENDING.value,
                "spec": json.dumps(spec.to_dict()),
                "attempt": 1,
                "submitted_at": now,
                "queued_at": now,
                "cancel_requested": False,
                "preempt_requested": False,
                "rev": rev,
                "held": held,
                "array_id": array_id,
                **({"reason_code": "held", "reason": _HELD} if held else {}),
            }
            for run_id, spec in zip(ids, specs, strict=True)
        ],
    ).all()  # fetched before the next statement
    why = "submitted (held)" if held else "submitted"
    conn.execute(
        events.insert(),
        [
            {"run_id": run_id, "time": now, "kind": "submitted", "phase_from": None,
             "phase_to": Phase.PENDING.value, "attempt": 1, "reason": why}
            for run_id in ids
        ],
    )  # fmt: skip
    return stored


_HELD = "held by user"


def expand_ids(store: Store, ids: Sequence[str]) -> list[str]:
    """Run ids for ``ids``, each a run id or an array id (its elements, in order); KeyError
    names the first that is neither."""
    out: list[str] = []
    with store._ro() as conn:
        for i in ids:
            if conn.execute(select(runs.c.id).where(runs.c.id == i)).first() is not None:
                out.append(i)
                continue
            q = select(runs.c.id).where(runs.c.array_id == i).order_by(runs.c.seq)
            elements = [r for (r,) in conn.execute(q)]
            if not elements:
                raise KeyError(i)
            out.extend(elements)
    return out


def set_held(
    store: Store, run_ids: Sequence[str], held: bool, now: float | None = None, by: str = "user"
) -> dict[str, str]:
    """Hold (or release) pending runs; what happened to each, by id. A run that is not
    pending, or already so, is left as it is (its entry says why)."""
    now = time.time() if now is None else now
    verb = "held" if held else "released"
    out: dict[str, str] = {}
    with store._tx() as conn:
        rows = locked_rows(conn, list(run_ids))
        change = []
        for rid in run_ids:
            row = rows[rid]
            if row.phase != Phase.PENDING.value:
                out[rid] = f"not {verb}: it is {row.phase} (only a pending run can be)"
            elif bool(row.held) == held:
                out[rid] = f"already {verb}"
            else:
                change.append(row)
                out[rid] = verb
        if change:
            rev = bump(conn)
            values: dict[str, Any] = {"held": held, "rev": rev}
            if held:
                values.update(reason_code="held", reason=_HELD)
            else:
                values.update(reason_code=None, reason=f"released by {by}", eta=None)
            ids = [r.id for r in change]
            for part in _chunks(ids):
                conn.execute(runs.update().where(runs.c.id.in_(part)).values(**values))
            conn.execute(
                events.insert(),
                [{"run_id": r.id, "time": now, "kind": verb, "phase_from": None, "phase_to": None,
                  "attempt": r.attempt, "reason": f"{verb} by {by}"} for r in change],
            )  # fmt: skip
    return out


def cancel_doomed(
    store: Store, items: Sequence[tuple[str, str]], now: float | None = None
) -> list[str]:
    """Cancel pending runs whose dependencies can never be met: (run id, reason) each; the
    ids cancelled (one no longer pending is left as it is)."""
    if not items:
        return []
    now = time.time() if now is None else now
    with store._tx() as conn:
        rows = locked_rows(conn, [rid for rid, _ in items])
        moves = [
            Move(rows[rid], Phase.CANCELLED, "cancelled", why,
                 {"finished_at": now, "reason_code": "dependency", "reason": why})
            for rid, why in items
            if rows[rid].phase == Phase.PENDING.value
        ]  # fmt: skip
        move_many(conn, moves, now)
    return [m.row.id for m in moves]


def final_phases(store: Store, run_ids: Sequence[str]) -> dict[str, Phase | None]:
    """How ``run_ids`` ended, by id: the phase of each that is over, None for an id the store
    does not know; ids of runs not over are left out."""
    out: dict[str, Phase | None] = dict.fromkeys(run_ids)
    with store._ro() as conn:
        for part in _chunks(list(run_ids)):
            for rid, phase in conn.execute(
                select(runs.c.id, runs.c.phase).where(runs.c.id.in_(part))
            ):
                if phase in _ENDED:
                    out[rid] = Phase(phase)
                else:
                    del out[rid]
    return out
