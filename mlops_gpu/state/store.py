"""``Store``: the one place run records change.

Every mutating method is one transaction: SQLite transactions start with ``BEGIN IMMEDIATE``
(the write lock is taken up front, so read-then-write never deadlocks and concurrent submitters
queue on ``busy_timeout`` instead of failing); PostgreSQL rows are locked with ``FOR UPDATE``.
Phase changes are compare-and-set: a method that finds the run in another phase than expected
changes nothing and reports it (``False`` or ``ConflictError``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select

from mlops_gpu.model import TERMINAL_PHASES, Phase, Run, RunSpec
from mlops_gpu.state import mlflow_notes
from mlops_gpu.state.jobs import JobControl, submit_runs
from mlops_gpu.state.ledger import UsageRow, read_usage
from mlops_gpu.state.mlflow_notes import MlflowLink, MlflowNote, UnclosedMlflowRun
from mlops_gpu.state.run_requests import RunRequests
from mlops_gpu.state.schema import events, revision, runs
from mlops_gpu.state.transitions import SchedulerMoves


@dataclass(frozen=True, slots=True)
class Event:
    run_id: str
    time: float
    kind: str
    phase_from: str | None
    phase_to: str | None
    attempt: int
    reason: str
    #: ``preempting`` events: the GPU-seconds of work the preemption throws away (since the
    #: victim's last checkpoint, else since its attempt started); None on other events.
    lost_gpu_s: float | None = None


class Store(SchedulerMoves, RunRequests):
    """``config``: the config file that names this store, for the one-line ``StoreError``
    (``open_check``) raised when it cannot be used. ``check_pages``: read every page at open
    (``PRAGMA quick_check``) however big the store. Its parts: ``StoreBase`` (engine,
    transactions, the one-run move), ``SchedulerMoves`` (``transitions``), ``RunRequests``
    (``run_requests``); reads, submits, notes and reasons are here."""

    def twin(self) -> Store:
        """Another Store on this one's engine, with its own ``fence`` (a scheduler thread
        beside a server's API). Never a second ``Store(url)`` of a SQLite file in one process:
        its open check reads the file with a plain ``open``/``close``, and closing any
        descriptor of a file drops all of the process's POSIX locks on it, so another process
        closing last then checkpoints and deletes the WAL this one still writes to."""
        twin = object.__new__(Store)
        twin.__dict__.update(self.__dict__)
        twin._runs, twin.fence = {}, None
        return twin

    # -- submit and read ------------------------------------------------------------------
    def submit(self, spec: RunSpec, now: float | None = None) -> Run:
        return self.submit_many([spec], now)[0]

    def submit_many(
        self,
        specs: Sequence[RunSpec],
        now: float | None = None,
        job: JobControl | None = None,
        audit: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[Run]:
        """Queue ``specs`` in one transaction (one revision): all of them or, on an error,
        none. A scheduler sees them in the same tick (a sweep, a burst of runs), and the
        store commits once instead of once per run. ``job``: arrays, holds, dependencies by
        name (``state.jobs``). ``audit``: one ``audit.entry_row`` (or None) per spec, stored in
        the same transaction with its run's id as ``target`` (the server's audited submits)."""
        return submit_runs(self, specs, now, job, audit)

    def get(self, run_id: str) -> Run | None:
        with self._ro() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        return self._run(row) if row is not None else None

    def list_runs(
        self,
        phases: Iterable[Phase] | None = None,
        project: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[Run]:
        q = select(runs)
        if phases is not None:
            q = q.where(runs.c.phase.in_([p.value for p in phases]))
        if project is not None:
            q = q.where(runs.c.project == project)
        q = q.order_by(runs.c.seq.desc() if newest_first else runs.c.seq)
        if limit is not None:
            q = q.limit(limit)
        with self._ro() as conn:
            return [self._run(r) for r in conn.execute(q)]

    def live_runs(self) -> tuple[list[Run], int]:
        """(every run not yet terminal, by seq; the store revision they reflect at least)."""
        live = [p.value for p in Phase if p not in TERMINAL_PHASES]
        with self._ro() as conn:
            # the revision first: under READ COMMITTED the rows may then be newer, never older
            rev = int(conn.execute(select(revision.c.value)).scalar_one())
            rows = conn.execute(select(runs).where(runs.c.phase.in_(live)).order_by(runs.c.seq))
            return [self._run(r) for r in rows], rev

    def revision(self) -> int:
        """The store revision: it rises with every change to a run (submit, cancel, move)."""
        with self._ro() as conn:
            return int(conn.execute(select(revision.c.value)).scalar_one())

    def changed_since(self, rev: int) -> tuple[list[Run], int]:
        """(the runs changed after revision ``rev``, in revision order; the latest revision
        among them, or ``rev``). Reason-only writes (``set_reasons``) are not changes."""
        with self._ro() as conn:
            rows = conn.execute(select(runs).where(runs.c.rev > rev).order_by(runs.c.rev)).all()
            out = [self._run(r) for r in rows]
            return out, (rows[-1].rev if rows else rev)

    def count(self) -> int:
        with self._ro() as conn:
            return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())

    def events(self, run_id: str | None = None) -> list[Event]:
        q = select(events).order_by(events.c.id)
        if run_id is not None:
            q = q.where(events.c.run_id == run_id)
        with self._ro() as conn:
            return [
                Event(
                    r.run_id,
                    r.time,
                    r.kind,
                    r.phase_from,
                    r.phase_to,
                    r.attempt,
                    r.reason,
                    r.lost_gpu_s,
                )
                for r in conn.execute(q)
            ]

    def usage(self, since: float | None = None, after_id: int | None = None) -> list[UsageRow]:
        """Ledger rows ending at or after ``since``, with an id above ``after_id``, by id."""
        with self._ro() as conn:
            return read_usage(conn, since, after_id)

    def note(
        self, run_id: str, attempt: int, kind: str, text: str, now: float | None = None
    ) -> None:
        """Append an event that changes nothing about the run, for readers of its history."""
        self.note_many([(run_id, attempt, kind, text)], now)

    def note_many(
        self, notes: Sequence[tuple[str, int, str, str]], now: float | None = None
    ) -> None:
        """``note`` for many (run id, attempt, kind, text), in one transaction."""
        if notes:
            at = time.time() if now is None else now
            with self._tx() as conn:
                conn.execute(events.insert(), [
                    {"run_id": rid, "time": at, "kind": kind, "phase_from": None,
                     "phase_to": None, "attempt": attempt, "reason": text}
                    for rid, attempt, kind, text in notes
                ])  # fmt: skip

    # -- MLflow runs (``mlflow_notes``) ----------------------------------------------------
    def note_mlflow(self, notes: Sequence[MlflowNote], now: float | None = None) -> None:
        """Record attempts' MLflow runs opened, made and closed, in one transaction."""
        if notes:
            with self._tx() as conn:
                mlflow_notes.apply(conn, notes, time.time() if now is None else now)

    def mlflow_links(self, run_id: str) -> list[MlflowLink]:
        """The run's MLflow runs, attempt by attempt, each attempt's in the order noted."""
        with self._ro() as conn:
            return mlflow_notes.links(conn, [run_id]).get(run_id, [])

    def mlflow_run_id(self, run_id: str, attempt: int) -> str | None:
        """The MLflow run of the attempt's latest launch, or None (not launched yet, tracking
        off, or its run not made yet)."""
        mine = [link for link in self.mlflow_links(run_id) if link.attempt == attempt]
        return mine[-1].mlflow_run_id if mine else None

    def unclosed_mlflow_runs(self, active: Iterable[Phase]) -> list[UnclosedMlflowRun]:
        """Attempts that are over whose MLflow run was noted at launch and never noted closed
        (``mlflow_notes``), with their usage-ledger figures."""
        with self._ro() as conn:
            return mlflow_notes.unclosed(conn, frozenset(active))

    def set_reasons(self, reasons: Sequence[tuple[str, str, str, float | None]]) -> int:
        """Store (run_id, reason_code, reason, eta) for pending runs whose reason changed: a new
        code or text, an ETA appearing or going, or an ETA moving by ``ETA_SLACK_S`` or more
        (ETAs that follow the clock would otherwise rewrite the whole queue every pass)."""
        if not reasons:
            return 0
        ids = [r[0] for r in reasons]
        with self._tx() as conn:
            current = {
                r.id: (r.reason_code, r.reason, r.eta)
                for r in conn.execute(
                    select(runs.c.id, runs.c.reason_code, runs.c.reason, runs.c.eta).where(
                        runs.c.id.in_(ids), runs.c.phase == Phase.PENDING.value
                    )
                )
            }
            rows = [
                {"rid": run_id, "code": code, "why": reason, "eta": eta}
                for run_id, code, reason, eta in reasons
                if run_id in current and _reason_changed(current[run_id], (code, reason, eta))
            ]
            if rows:
                # One statement executed for many rows: a busy queue changes thousands of
                # reasons a tick, and compiling an UPDATE per row cost seconds.
                conn.execute(
                    runs.update()
                    .where(runs.c.id == bindparam("rid"), runs.c.phase == Phase.PENDING.value)
                    .values(
                        reason_code=bindparam("code"), reason=bindparam("why"), eta=bindparam("eta")
                    ),
                    rows,
                )
        return len(rows)


#: ETA moves smaller than this are not written (``Store.set_reasons``).
ETA_SLACK_S = 5.0


def _reason_changed(
    old: tuple[str | None, str | None, float | None], new: tuple[str, str, float | None]
) -> bool:
    if old[:2] != new[:2] or (old[2] is None) != (new[2] is None):
        return True
    return old[2] is not None and new[2] is not None and abs(old[2] - new[2]) >= ETA_SLACK_S


def open_store(url: str, *, config: str | os.PathLike[str] | None = None) -> Store:
    return Store(url, config=config)
