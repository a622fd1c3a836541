"""The scheduler's moves of a run: admitted (and rolled back after a failed launch), given its
backend handle, running, finished, requeued after a preemption or a loss.

What a move means (retry, requeue, backoff, cancel wins) is decided by the run lifecycle
(``model.lifecycle``) from the row read in the transaction; the store applies its
``Transition``. Each is one transaction and a compare-and-set on the run's phase
(``StoreBase._move``, ``bulk.move_many``): a run found elsewhere than expected is left as it is
and the caller is told (``False``, or ``ConflictError``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sqlalchemy import Connection, func, select

from mlops_gpu.model import Phase, Placement, RunSpec, lifecycle
from mlops_gpu.state.base import StoreBase, run_state
from mlops_gpu.state.bulk import Move, locked_rows, move_many
from mlops_gpu.state.errors import ConflictError
from mlops_gpu.state.ledger import record_usage
from mlops_gpu.state.schema import events, runs


class SchedulerMoves(StoreBase):
    """The scheduler's phase moves (``Store`` inherits them)."""

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
                ok = lifecycle.admissible(run_state(row))
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
        was requested meanwhile ends cancelled instead (``lifecycle.rollback``)."""
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            t = lifecycle.rollback(run_state(row), reason)
            if t is None:
                raise ConflictError(f"run {run_id} is {row.phase}, not admitted")
            return self._apply(conn, row, t, now)

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
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            t = lifecycle.finish(run_state(row), phase, reason)
            if t is None:
                return False
            held = record_usage(conn, row, now, phase.value, mean_util, idle_s)
            self._apply(
                conn,
                row,
                t,
                now,
                attained_gpu_s=(row.attained_gpu_s or 0.0) + held,
                started_at=row.started_at if row.started_at is not None else started_at,
                exit_code=exit_code,
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
        kind: Literal["preempted", "lost"],
        reason: str,
        max_attempts: int | None,
        now: float | None = None,
        backoff_s: float = 0.0,
        mean_util: float | None = None,
        idle_s: float = 0.0,
    ) -> Phase:
        """A preempted or lost run: pending as attempt + 1 (not admitted again before
        ``backoff_s`` has passed), or failed once retries are spent, or cancelled if its cancel
        was requested (``lifecycle.requeue``). The GPU time it held stays counted (ledger,
        ``attained_gpu_s``), so fair share remembers it."""
        assert kind in ("preempted", "lost")
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            # preemptions are the scheduler's doing: only the other attempts use up retries
            state = run_state(row, self._preempted_attempts(conn, run_id))
            t = lifecycle.requeue(state, kind, reason, max_attempts, now, backoff_s)
            if t is None:
                raise ConflictError(f"run {run_id} is {row.phase}; only active runs requeue")
            held = record_usage(conn, row, now, kind, mean_util, idle_s)
            return self._apply(conn, row, t, now, attained_gpu_s=(row.attained_gpu_s or 0.0) + held)
