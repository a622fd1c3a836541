"""``StoreBase``: what every part of the ``Store`` stands on: the engine, its transactions, the
cache of built runs, and the one-run phase move with its event.

Invariants: every write goes through ``_tx`` (one transaction; fenced by the scheduler lease
while this process holds it, ``lease.check``); reads through ``_ro``; a phase change is
``_move``, a compare-and-set on the row's phase with its event (``bulk.move_many``); a move the
run lifecycle decided (``model.lifecycle``) is ``_apply`` of its ``Transition``.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Row, select

from mlops_gpu.model import TERMINAL_PHASES, Phase, Placement, Run, RunSpec
from mlops_gpu.model.lifecycle import Keep, RunState, Transition
from mlops_gpu.state import lease
from mlops_gpu.state.bulk import Move, bump, move_many
from mlops_gpu.state.connect import build_new, engine_for
from mlops_gpu.state.migrations import LATEST, applied, migrate
from mlops_gpu.state.open_check import Hints, check_file, create_new, inspect_existing, sqlite_file
from mlops_gpu.state.open_check import translate as _translate
from mlops_gpu.state.schema import events, runs

_RUN_CACHE = 100_000
_SPEC_AT = list(runs.c.keys()).index("spec")  # the spec's place in a runs row


def new_run_id() -> str:
    return "r" + secrets.token_hex(5)


def _row_to_run(r: Row[Any], spec: RunSpec | None = None) -> Run:
    return Run(
        id=r.id,
        seq=r.seq,
        spec=spec if spec is not None else RunSpec.from_dict(json.loads(r.spec)),
        phase=Phase(r.phase),
        attempt=r.attempt,
        submitted_at=r.submitted_at,
        admitted_at=r.admitted_at,
        started_at=r.started_at,
        finished_at=r.finished_at,
        placement=Placement.from_dict(json.loads(r.placement)) if r.placement else None,
        handle=r.handle,
        exit_code=r.exit_code,
        reason_code=r.reason_code,
        reason=r.reason,
        eta=r.eta,
        cancel_requested=bool(r.cancel_requested),
        preempt_requested=bool(r.preempt_requested),
        last_checkpoint_at=r.last_checkpoint_at,
        attained_gpu_s=r.attained_gpu_s or 0.0,
        not_before=r.not_before,
        queued_at=r.queued_at,
        held=bool(r.held),
    )


class StoreBase:
    """``config``: the config file that names this store, for the one-line ``StoreError``
    (``open_check``) raised when it cannot be used. ``check_pages``: read every page at open
    (``PRAGMA quick_check``) however big the store."""

    def __init__(
        self, url: str, *, config: str | os.PathLike[str] | None = None, check_pages: bool = False
    ) -> None:
        self.url = url
        self._hints = Hints(config)
        path = sqlite_file(url)
        if path is not None:  # what is at the path is checked before anything writes to it
            if not check_file(path, self._hints):
                create_new(path, build_new, self._hints)
            inspect_existing(path, LATEST, self._hints, check_pages=check_pages)
        self.engine = engine_for(url)
        # run id -> (the row last read, the Run built from it); see ``_run``.
        self._runs: dict[str, tuple[tuple[Any, ...], Run]] = {}
        #: The epoch of the scheduler lease this process holds (``LeaderLock``), else None.
        #: While set, every write transaction first checks that the store still holds that
        #: epoch for this process (fencing: ``lease.check``), so a leader that lost its lease
        #: commits nothing more.
        self.fence: tuple[int, str] | None = None  # (epoch, holder)
        with self._ro() as conn:
            current = applied(conn)
        if current != LATEST:  # new, older or newer (``migrate`` says so): under the lock
            with self._tx() as conn:
                migrate(conn)

    def check_pages(self) -> None:
        """Read every page of a SQLite store (``PRAGMA quick_check``, about 10 ms per MiB):
        ``StoreError`` if one is damaged. The scheduler does this at its start."""
        path = sqlite_file(self.url)
        if path is not None:
            inspect_existing(path, LATEST, self._hints, check_pages=True)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def _run(self, row: Row[Any]) -> Run:
        # A run read before with the very same row is the same (frozen) Run: the scheduler
        # reads every pending run each tick, and building them was most of that read.
        key = tuple(row)
        hit = self._runs.get(row.id)
        if hit is not None and hit[0] == key:
            return hit[1]
        if len(self._runs) >= _RUN_CACHE:
            self._runs.clear()  # crude but bounded; a daemon reads mostly live runs
        # the spec is rebuilt only when its text changed (``amend``: ``mlops-gpu update``)
        same = hit is not None and hit[0][_SPEC_AT] == row.spec
        spec = hit[1].spec if same and hit else RunSpec.from_dict(json.loads(row.spec))
        run = _row_to_run(row, spec)
        self._runs[row.id] = (key, run)
        return run

    # -- transactions ---------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with _translate(self.url, self._hints), self.engine.begin() as conn:
            if self.fence is not None:
                lease.check(conn, self.fence)
            yield conn

    @staticmethod
    def _bump(conn: Connection) -> int:
        """Raise the store revision (``schema.revision``) in this transaction; the new value."""
        return bump(conn)

    @contextmanager
    def _ro(self) -> Iterator[Connection]:
        with (
            _translate(self.url, self._hints),
            self.engine.connect().execution_options(readonly=True) as conn,
            conn.begin(),
        ):
            yield conn

    def _locked(self, conn: Connection, run_id: str) -> Row[Any]:
        row = conn.execute(select(runs).where(runs.c.id == run_id).with_for_update()).first()
        if row is None:
            raise KeyError(run_id)
        return row

    @staticmethod
    def _event(
        conn: Connection,
        run_id: str,
        now: float,
        kind: str,
        src: str | None,
        dst: str | None,
        attempt: int,
        reason: str,
        lost_gpu_s: float | None = None,
    ) -> None:
        conn.execute(
            events.insert().values(
                run_id=run_id,
                time=now,
                kind=kind,
                phase_from=src,
                phase_to=dst,
                attempt=attempt,
                reason=reason,
                lost_gpu_s=lost_gpu_s,
            )
        )

    def _move(
        self,
        conn: Connection,
        row: Row[Any],
        dst: Phase,
        now: float,
        kind: str,
        why: str,
        **values: Any,
    ) -> None:
        """Compare-and-set ``row``'s phase to ``dst`` (plus ``values``) with its event."""
        move_many(conn, [Move(row, dst, kind, why, values)], now)

    def _apply(
        self, conn: Connection, row: Row[Any], t: Transition, now: float, **values: Any
    ) -> Phase:
        """Apply the lifecycle's ``t`` to ``row`` (``_move``: compare-and-set on the phase read,
        with its event), plus ``values``; the phase after."""
        self._move(conn, row, t.phase, now, t.kind, t.event, **transition_columns(t, now), **values)
        return t.phase


#: What a run holds while admitted, cleared when it goes back to the queue.
_ADMISSION = ("admitted_at", "placement", "gpu_type", "backend", "handle")


def run_state(row: Row[Any], preempted_attempts: int = 0) -> RunState:
    """What the lifecycle reads of a runs row (``model.lifecycle``)."""
    return RunState(
        Phase(row.phase),
        row.attempt,
        cancel_requested=bool(row.cancel_requested),
        held=bool(row.held),
        preempted_attempts=preempted_attempts,
    )


def transition_columns(t: Transition, now: float) -> dict[str, Any]:
    """The runs columns a lifecycle ``Transition`` sets at ``now``."""
    values: dict[str, Any] = {}
    if t.phase in TERMINAL_PHASES:
        values["finished_at"] = now
    if t.requeue:  # the attempt is over: the next one starts from nothing
        values.update(dict.fromkeys((*_ADMISSION, "started_at", "exit_code")))
        values.update(attempt=t.attempt, preempt_requested=False, queued_at=now)
        values["not_before"] = t.not_before
    elif t.phase is Phase.PENDING:  # an admission undone (never launched)
        values.update(dict.fromkeys(_ADMISSION))
    if not isinstance(t.code, Keep):
        values["reason_code"] = t.code
    if not isinstance(t.reason, Keep):
        values["reason"] = t.reason
    return values
