"""``Store``: the one place run records change.

Every mutating method is one transaction: SQLite transactions start with ``BEGIN IMMEDIATE``
(the write lock is taken up front, so read-then-write never deadlocks and concurrent submitters
queue on ``busy_timeout`` instead of failing); PostgreSQL rows are locked with ``FOR UPDATE``.
Phase changes are compare-and-set: a method that finds the run in another phase than expected
changes nothing and reports it (``False`` or ``ConflictError``).
"""

from __future__ import annotations

import json
import os
import secrets
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Row, bindparam, create_engine, event, func, select
from sqlalchemy.engine import make_url

from mlops_gpu.model import ACTIVE_PHASES, TERMINAL_PHASES, Phase, Placement, Run, RunSpec
from mlops_gpu.state import lease
from mlops_gpu.state.bulk import Move, bump, locked_rows, move_many
from mlops_gpu.state.errors import ConflictError
from mlops_gpu.state.jobs import JobControl, submit_runs
from mlops_gpu.state.ledger import UsageRow, read_usage, record_usage
from mlops_gpu.state.migrations import LATEST, migrate
from mlops_gpu.state.mlflow_notes import UnclosedMlflowRun, note_rows, unclosed
from mlops_gpu.state.open_check import Hints, check_file, create_new, inspect_existing, sqlite_file
from mlops_gpu.state.open_check import translate as _translate
from mlops_gpu.state.schema import events, revision, runs


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


def new_run_id() -> str:
    return "r" + secrets.token_hex(5)


_RUN_CACHE = 100_000
_SPEC_AT = list(runs.c.keys()).index("spec")  # the spec's place in a runs row
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _after_fork() -> None:
    for eng in list(_ENGINES):
        eng.dispose(close=False)


os.register_at_fork(after_in_child=_after_fork)


def _engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # Pooled connections: opening one (and its PRAGMAs) per transaction cost about a
        # millisecond, several times per admitted run. A forked child drops the parent's pooled
        # connections without closing them (``_after_fork``), as SQLAlchemy advises.
        eng = create_engine(url, connect_args={"timeout": 120, "check_same_thread": False})
        _ENGINES.add(eng)

        @event.listens_for(eng, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=120000")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(eng, "begin")
        def _on_begin(conn: Connection) -> None:
            ro = conn.get_execution_options().get("readonly", False)
            conn.exec_driver_sql("BEGIN" if ro else "BEGIN IMMEDIATE")

        return eng
    # A server that does not answer fails the open in seconds, not after TCP's minutes (unless
    # the URL sets its own connect_timeout).
    args = {} if "connect_timeout" in make_url(url).query else {"connect_timeout": 10}
    # all 10 kept open once opened: with 2 kept (4 more allowed), a server's bursts (identity
    # reads) connected and closed the rest each time, a PostgreSQL backend started for each
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=0, connect_args=args)


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


def _build_new(path: str) -> None:
    eng = _engine("sqlite:///" + path)
    try:
        with eng.begin() as conn:
            migrate(conn)
    finally:
        eng.dispose()  # the last connection out folds the WAL into the file


class Store:
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
                create_new(path, _build_new, self._hints)
            inspect_existing(path, LATEST, self._hints, check_pages=check_pages)
        self.engine = _engine(url)
        # run id -> (the row last read, the Run built from it); see ``_run``.
        self._runs: dict[str, tuple[tuple[Any, ...], Run]] = {}
        #: The epoch of the scheduler lease this process holds (``LeaderLock``), else None.
        #: While set, every write transaction first checks that the store still holds that
        #: epoch for this process (fencing: ``lease.check``), so a leader that lost its lease
        #: commits nothing more.
        self.fence: tuple[int, str] | None = None  # (epoch, holder)
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

    # -- submit and read ------------------------------------------------------------------
    def submit(self, spec: RunSpec, now: float | None = None) -> Run:
        return self.submit_many([spec], now)[0]

    def submit_many(
        self, specs: Sequence[RunSpec], now: float | None = None, job: JobControl | None = None
    ) -> list[Run]:
        """Queue ``specs`` in one transaction (one revision): all of them or, on an error,
        none. A scheduler sees them in the same tick (a sweep, a burst of runs), and the
        store commits once instead of once per run. ``job``: arrays, holds, dependencies by
        name (``state.jobs``)."""
        return submit_runs(self, specs, now, job)

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

    # -- scheduler transitions ------------------------------------------------------------
    def admit(self, run_id: str, placement: Placement, now: float | None = None) -> bool:
        """pending -> admitted with its placement, before any launch. False if not pending."""
        return self.admit_many([(run_id, placement)], now)[0]

    def admit_many(
        self,
        items: Sequence[tuple[str, Placement]],
        now: float | None = None,
        decided: Mapping[str, RunSpec] | None = None,
    ) -> list[bool]:
        """``admit`` for each (run id, placement), in one transaction of a few statements (a
        cycle's admissions; ``bulk``). ``decided``: the spec each decision assumed; a run whose
        spec changed since (``amend``) is not admitted (False), as a cancelled one."""
        now = time.time() if now is None else now
        out: list[bool] = []
        moves: list[Move] = []
        with self._tx() as conn:
            rows = locked_rows(conn, [run_id for run_id, _ in items])
            for run_id, placement in items:
                row = rows[run_id]
                # (held or cancelled meanwhile: the change comes back through the feed)
                ok = row.phase == Phase.PENDING.value and not row.cancel_requested and not row.held
                if ok and decided is not None and run_id in decided:
                    spec, want = self._run(row).spec, decided[run_id]
                    ok = spec is want or spec == want
                out.append(ok)
                if not ok:
                    continue
                nodes = ",".join(placement.node_names)
                why = f"placed on {nodes} ({placement.total_gpus} {placement.gpu_type})"
                values = {
                    "admitted_at": now,
                    "placement": json.dumps(placement.to_dict()),
                    "gpu_type": placement.gpu_type,
                    "backend": placement.backend,
                    "reason_code": None,
                    "reason": None,
                    "eta": None,
                    "handle": None,
                }
                moves.append(Move(row, Phase.ADMITTED, "admitted", why, values))
            move_many(conn, moves, now)
        return out

    def rollback_admission(self, run_id: str, reason: str, now: float | None = None) -> Phase:
        """admitted -> pending after a failed launch; the GPUs are free again. A run whose cancel
        was requested meanwhile ends cancelled instead (it would never be admitted again)."""
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            if row.phase != Phase.ADMITTED.value:
                raise ConflictError(f"run {run_id} is {row.phase}, not admitted")
            if row.cancel_requested:
                self._move(
                    conn,
                    row,
                    Phase.CANCELLED,
                    now,
                    "cancelled",
                    f"{reason}; cancelled as requested",
                    finished_at=now,
                    reason="cancelled by user",
                    reason_code=None,
                )
                return Phase.CANCELLED
            self._move(
                conn,
                row,
                Phase.PENDING,
                now,
                "launch_failed",
                reason,
                admitted_at=None,
                placement=None,
                gpu_type=None,
                backend=None,
                handle=None,
                reason_code="launch_failed",
                reason=reason,
            )
            return Phase.PENDING

    def set_handle(self, run_id: str, handle: str, phase: Phase, now: float | None = None) -> None:
        """admitted -> starting/running once the backend accepted the launch."""
        self.set_handles([(run_id, handle)], phase, now)

    def set_handles(
        self, items: Sequence[tuple[str, str]], phase: Phase, now: float | None = None
    ) -> None:
        """``set_handle`` for each (run id, handle), in one transaction (``bulk``)."""
        now = time.time() if now is None else now
        moves: list[Move] = []
        with self._tx() as conn:
            rows = locked_rows(conn, [run_id for run_id, _ in items])
            for run_id, handle in items:
                row = rows[run_id]
                values: dict[str, Any] = {"handle": handle}
                if row.reason_code == "preempting":  # a preemptor that waited (``set_waiting``)
                    values.update(reason_code=None, reason=None, eta=None)
                if phase is Phase.RUNNING:
                    values["started_at"] = row.started_at if row.started_at is not None else now
                if row.phase == phase.value:  # a new handle only (a reconciled job)
                    values["rev"] = self._bump(conn)
                    conn.execute(runs.update().where(runs.c.id == run_id).values(**values))
                    continue
                moves.append(Move(row, phase, str(phase), f"backend handle {handle}", values))
            move_many(conn, moves, now)

    def mark_running(self, run_id: str, now: float | None = None) -> bool:
        return self.mark_running_many([run_id], now)[0]

    def mark_running_many(self, run_ids: Sequence[str], now: float | None = None) -> list[bool]:
        """admitted or starting -> running, for each id, in one transaction (a poll that sees a
        burst of jobs start); False where the run was elsewhere (stopped meanwhile)."""
        if not run_ids:
            return []
        now = time.time() if now is None else now
        out, moves, seen = [], [], set()
        with self._tx() as conn:
            rows = locked_rows(conn, run_ids)
            for run_id in run_ids:
                row = rows[run_id]
                ok = row.phase in (Phase.ADMITTED.value, Phase.STARTING.value)
                out.append(ok and run_id not in seen)
                if not out[-1]:
                    continue
                seen.add(run_id)
                started = row.started_at if row.started_at is not None else now
                why = "the backend reports it running"
                moves.append(Move(row, Phase.RUNNING, "running", why, {"started_at": started}))
            move_many(conn, moves, now)
        return out

    def finish(
        self,
        run_id: str,
        phase: Phase,
        reason: str,
        exit_code: int | None = None,
        now: float | None = None,
        started_at: float | None = None,
        mean_util: float | None = None,
        idle_s: float = 0.0,
    ) -> bool:
        """An active run ends (succeeded, failed or cancelled); its usage is recorded once.

        ``started_at``: when the backend says the job started, for a run that ended before the
        scheduler saw it running."""
        assert phase in TERMINAL_PHASES
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            if Phase(row.phase) in TERMINAL_PHASES:
                return False
            held = record_usage(conn, row, now, phase.value, mean_util, idle_s)
            self._move(
                conn,
                row,
                phase,
                now,
                phase.value,
                reason,
                attained_gpu_s=(row.attained_gpu_s or 0.0) + held,
                finished_at=now,
                started_at=row.started_at if row.started_at is not None else started_at,
                exit_code=exit_code,
                reason_code=None,
                reason=reason,
                eta=None,
            )
        return True

    @staticmethod
    def _preempted_attempts(conn: Connection, run_id: str) -> int:
        """How many of the run's attempts ended preempted (requeued by the scheduler)."""
        q = (
            select(func.count())
            .select_from(events)
            .where(events.c.run_id == run_id, events.c.kind == "preempted")
        )
        return int(conn.execute(q).scalar_one())

    def requeue(
        self,
        run_id: str,
        kind: str,
        reason: str,
        max_attempts: int | None,
        now: float | None = None,
        backoff_s: float = 0.0,
        mean_util: float | None = None,
        idle_s: float = 0.0,
    ) -> Phase:
        """A preempted or lost run: pending as attempt + 1 (not admitted again before
        ``backoff_s`` has passed), or failed once retries are spent. The GPU time it held
        stays counted (ledger, ``attained_gpu_s``), so fair share remembers it."""
        assert kind in ("preempted", "lost")
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            if Phase(row.phase) not in ACTIVE_PHASES:
                raise ConflictError(f"run {run_id} is {row.phase}; only active runs requeue")
            held = record_usage(conn, row, now, kind, mean_util, idle_s)
            attained = (row.attained_gpu_s or 0.0) + held
            if row.cancel_requested:
                self._move(
                    conn,
                    row,
                    Phase.CANCELLED,
                    now,
                    kind,
                    f"{reason}; cancelled as requested",
                    finished_at=now,
                    attained_gpu_s=attained,
                )
                return Phase.CANCELLED
            # preemptions are the scheduler's doing: only the other attempts use up retries
            counted = row.attempt - self._preempted_attempts(conn, run_id)
            if max_attempts is not None and counted >= max_attempts:
                self._move(
                    conn,
                    row,
                    Phase.FAILED,
                    now,
                    kind,
                    f"{reason}; attempt {counted} of {max_attempts} (preemptions not counted), "
                    "no retries left",
                    finished_at=now,
                    reason=reason,
                    attained_gpu_s=attained,
                )
                return Phase.FAILED
            self._move(
                conn,
                row,
                Phase.PENDING,
                now,
                kind,
                reason,
                attempt=row.attempt + 1,
                admitted_at=None,
                started_at=None,
                placement=None,
                gpu_type=None,
                backend=None,
                handle=None,
                exit_code=None,
                preempt_requested=False,
                attained_gpu_s=attained,
                not_before=now + backoff_s if backoff_s > 0 else None,
                queued_at=now,
                reason_code=kind,
                reason=f"{reason}; requeued as attempt {row.attempt + 1}",
            )
            return Phase.PENDING

    # -- user requests --------------------------------------------------------------------
    def request_cancel(self, run_id: str, now: float | None = None) -> Phase:
        """Cancel a run: a pending one at once, an active one by flag (the controller stops it).

        Returns the phase after the call (terminal runs are left as they are).
        """
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            phase = Phase(row.phase)
            if phase is Phase.PENDING:
                self._move(
                    conn,
                    row,
                    Phase.CANCELLED,
                    now,
                    "cancelled",
                    "cancelled by user",
                    finished_at=now,
                    reason="cancelled by user",
                    reason_code=None,
                )
                return Phase.CANCELLED
            if phase in ACTIVE_PHASES and not row.cancel_requested:
                conn.execute(
                    runs.update()
                    .where(runs.c.id == run_id)
                    .values(cancel_requested=True, rev=self._bump(conn))
                )
                self._event(
                    conn,
                    run_id,
                    now,
                    "cancel_requested",
                    None,
                    None,
                    row.attempt,
                    "cancel requested by user",
                )
            return phase

    def mark_preempting(
        self, run_id: str, reason: str, now: float | None = None, lost_gpu_s: float | None = None
    ) -> None:
        """Flag an active run for preemption, with its ``preempting`` event (``lost_gpu_s``:
        the work the preemption throws away, shown by ``status --events`` and MLflow)."""
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            if Phase(row.phase) not in ACTIVE_PHASES or row.preempt_requested:
                return
            conn.execute(
                runs.update()
                .where(runs.c.id == run_id)
                .values(preempt_requested=True, rev=self._bump(conn))
            )
            self._event(conn, run_id, now, "preempting", None, None, row.attempt, reason,
                        lost_gpu_s)  # fmt: skip

    def set_waiting(
        self, items: Sequence[tuple[str, str, float | None]], now: float | None = None
    ) -> None:
        """For admitted runs not launched yet (a preemptor waiting for its victims to exit):
        (run id, reason, eta). The reason is stored (code ``preempting``) without raising the
        revision (it changes nothing the scheduler decides on); a new reason text is also an
        event ``waiting``, so ``status --events`` shows why the start waited."""
        if not items:
            return
        now = time.time() if now is None else now
        with self._tx() as conn:
            rows = locked_rows(conn, [run_id for run_id, _, _ in items])
            for run_id, reason, eta in items:
                row = rows[run_id]
                if row.phase != Phase.ADMITTED.value or row.handle is not None:
                    continue
                if row.reason != reason:
                    self._event(conn, run_id, now, "waiting", None, None, row.attempt, reason)
                conn.execute(
                    runs.update()
                    .where(runs.c.id == run_id)
                    .values(reason_code="preempting", reason=reason, eta=eta)
                )

    def record_checkpoint(self, run_id: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            conn.execute(
                runs.update()
                .where(runs.c.id == run_id)
                .values(last_checkpoint_at=now, rev=self._bump(conn))
            )
            self._event(
                conn, run_id, now, "checkpoint", None, None, row.attempt, "checkpoint saved"
            )

    def flag(self, run_id: str, kind: str, reason: str, now: float | None = None) -> bool:
        """Note something about an active run without moving it (e.g. ``idle``): an event,
        and the run's reason shows it. Returns False when the run is no longer active."""
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            if Phase(row.phase) not in ACTIVE_PHASES:
                return False
            conn.execute(
                runs.update()
                .where(runs.c.id == run_id)
                .values(reason_code=kind, reason=reason, rev=self._bump(conn))
            )
            self._event(conn, run_id, now, kind, None, None, row.attempt, reason)
        return True

    def note(
        self, run_id: str, attempt: int, kind: str, text: str, now: float | None = None
    ) -> None:
        """Append an event that changes nothing about the run (e.g. ``mlflow_run``: the
        attempt's MLflow run id), for readers of its history."""
        self.note_many([(run_id, attempt, kind, text)], now)

    def note_many(
        self, notes: Sequence[tuple[str, int, str, str]], now: float | None = None
    ) -> None:
        """``note`` for many (run id, attempt, kind, text), in one transaction."""
        if notes:
            with self._tx() as conn:
                conn.execute(events.insert(), note_rows(notes, time.time() if now is None else now))

    def unclosed_mlflow_runs(self, active: Iterable[Phase]) -> list[UnclosedMlflowRun]:
        """Attempts that are over whose MLflow run was noted at launch and never noted closed
        (``mlflow_notes``), with their usage-ledger figures."""
        with self._ro() as conn:
            return unclosed(conn, frozenset(active))

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
