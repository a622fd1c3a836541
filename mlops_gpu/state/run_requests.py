"""Requests and notes on a run that do not end it: a cancel (a pending run ends at once, an
active one is flagged and the controller stops it), a preemption flag, a preemptor's waiting
reason, a checkpoint, a flag such as ``idle``.

Each is one transaction on the locked row; a flag raises the store revision (the scheduler sees
it through the change feed) and leaves an event.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from mlops_gpu.model import ACTIVE_PHASES, Phase, lifecycle
from mlops_gpu.state.base import StoreBase, run_state
from mlops_gpu.state.bulk import locked_rows
from mlops_gpu.state.schema import runs


class RunRequests(StoreBase):
    """Cancel, preemption and other flags on runs (``Store`` inherits them)."""

    def request_cancel(self, run_id: str, now: float | None = None) -> Phase:
        """Cancel a run: a pending one at once, an active one by flag (the controller stops it;
        ``lifecycle.cancel``).

        Returns the phase after the call (terminal runs are left as they are).
        """
        now = time.time() if now is None else now
        with self._tx() as conn:
            row = self._locked(conn, run_id)
            state = run_state(row)
            if (t := lifecycle.cancel(state)) is not None:
                return self._apply(conn, row, t, now)
            if lifecycle.flags_cancel(state):
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
            return state.phase

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
