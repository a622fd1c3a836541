"""Closing attempts' MLflow runs off the tick's path: a queue drained by one worker thread.

Closing an attempt's MLflow run (its queue wait, GPU-hours and cost, its outcome, its status)
is two to four MLflow writes; with MLflow's SQLite store each is a transaction of some 10 ms of
Python. Done inside the tick, a tick that saw a hundred runs end stalled for seconds before the
next admission. Here the tick only queues the close; the worker makes it.

Invariants:
- One worker, first in first out: an attempt's close follows whatever was queued before it,
  and never reaches MLflow before the attempt's run was created (that happens at its launch).
- Nothing is lost on a crash. The store is the durable record: an attempt whose MLflow run was
  noted at launch (table ``mlflow_runs``) and is over, but is not noted closed, is
  queued again by ``recover`` at the next start and closed from the usage ledger (outcome,
  times, GPU-seconds, queue wait, utilization), which the store wrote in the same transaction
  that ended it. A close is noted after MLflow took it: at least once, never lost.
- The worker notes a close only after MLflow took it; tracking failures are
  the tracker's to report (``Tracker``: logged once, backing off), never the tick's. While
  MLflow is away the closes wait in the queue and are tried again after the back-off; a close
  that failed about its own run (MLflow answered) is not tried again.
- An attempt launched before its MLflow run was made notes its MLflow run without an id, so
  a stop loses neither the run nor its close: ``recover`` makes and closes it from the store
  (``Tracker.close_recovered``).
- ``close`` (the controller's ``release``, at a stop) waits for the queue to empty while it
  moves, but not past ``STALL_S`` without progress nor at all while MLflow is away: a stop
  never waits for an MLflow that does not answer. What is left is closed at the next start.
- Launches go first: inside ``priority`` (the tick's launches) the worker starts no close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from mlops_gpu.model import Phase, Run
from mlops_gpu.model.phase import ACTIVE_PHASES
from mlops_gpu.state.mlflow_notes import MlflowNote, UnclosedMlflowRun
from mlops_gpu.state.store import Store
from mlops_gpu.tracking.tracker import ADOPT_ENV, Tracker

log = logging.getLogger("mlops_gpu.tracking")

#: Closes taken per round: their notes go to the store in one transaction.
BATCH = 100
#: ``close`` gives up when the queue did not move for this long.
STALL_S = 1.0


@dataclass(frozen=True, slots=True)
class Ended:
    """An attempt that ended: what ``Tracker.ended`` needs to close its MLflow run."""

    run: Run
    outcome: str
    end: float
    mean_util: float | None = None
    #: The attempt's MLflow run when the controller knows it: a launch that failed is tried
    #: again under the same attempt number, maybe before this close is made.
    mlflow_run_id: str | None = None
    #: A preempted attempt: the GPU-seconds of work its preemption threw away.
    lost_gpu_s: float | None = None


class TrackingQueue:
    def __init__(self, tracker: Tracker, store: Store) -> None:
        self.tracker, self.store = tracker, store
        self._items: deque[Ended | UnclosedMlflowRun] = deque()
        self._cond = threading.Condition()
        self._busy = 0  # closes taken by the worker and not yet noted
        self._thread: threading.Thread | None = None
        self._stop = False
        self._held = 0  # launches in progress: the worker waits (``priority``)
        self._done = 0  # closes made or given up (``close`` watches it move)
        tracker.note = store.note_mlflow

    def put(self, items: Sequence[Ended | UnclosedMlflowRun]) -> None:
        if not items or self.tracker.rest is None:
            return
        with self._cond:
            self._items.extend(items)
            if self._thread is None:  # started on the first close: most configs track nothing
                self._stop = False
                self._thread = threading.Thread(target=self._work, name="mlflow-close", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    @contextmanager
    def priority(self) -> Iterator[None]:
        """While inside, the worker starts no close: a tick's launches create MLflow runs, and
        with a local store every MLflow write takes one lock; a launch must not queue behind
        closes that can wait."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._items) + self._busy

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued close was made (or failed); False if ``timeout_s`` passed."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._items and not self._busy, timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Drain (up to ``timeout_s``, while the queue moves; not while MLflow is away or stuck),
        then stop the worker. What is left is closed by the next start's ``recover``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._items or self._busy:
                done, left = self._done, deadline - time.monotonic()
                if self.tracker.down or self.tracker.stuck or left <= 0:
                    break
                until = time.monotonic() + min(STALL_S, left)
                while self._done == done and (self._items or self._busy):
                    if (wait := until - time.monotonic()) <= 0:
                        break
                    self._cond.wait(wait)  # (notified at each close made)
                if self._done == done:
                    break  # stalled: MLflow does not answer (or is still opening its store)
            left_over = len(self._items) + self._busy
            self._stop = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if left_over:
            log.warning("MLflow: %d runs not closed yet; the next start closes them", left_over)
        if thread is not None:
            thread.join(timeout=STALL_S)

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._items or self._stop)
                if self._stop:
                    return  # (what is left: the next start's ``recover``)
                batch = [self._items.popleft() for _ in range(min(BATCH, len(self._items)))]
                self._busy = len(batch)
            again: list[Ended | UnclosedMlflowRun] = []
            try:
                again = self._close(batch)
            except Exception:  # never let the worker die: the next start recovers the rest
                log.exception("MLflow: closing %d runs failed", len(batch))
            finally:
                with self._cond:
                    self._items.extendleft(reversed(again))  # (first in, first out still)
                    self._busy = 0
                    self._cond.notify_all()
            if again:  # MLflow is away: try again after the tracker's back-off
                with self._cond:
                    self._cond.wait_for(lambda: self._stop, max(self.tracker.retry_in(), 0.1))

    def recover(self) -> int:
        """Queue the closes of attempts that are over but whose MLflow runs were never closed
        (the scheduler stopped first, or MLflow was away); how many. Made by the worker like
        any other, so a long backlog does not hold up the first tick."""
        if self.tracker.rest is None:
            return 0
        found = [u for u in self.store.unclosed_mlflow_runs(ACTIVE_PHASES) if not self._again(u)]
        if found:
            log.info("MLflow: %d runs ended while the scheduler was away; closing them", len(found))
            self.put(found)
        return len(found)

    def _again(self, u: UnclosedMlflowRun) -> bool:
        """Whether the attempt, rolled back to pending, will log into this MLflow run again:
        the submitter's, which every launch of the first attempt adopts (``Tracker.adopts``)."""
        run = self.store.get(u.run_id)
        return (
            run is not None
            and run.phase is Phase.PENDING
            and run.attempt == u.attempt
            and self.tracker.adopts(run)
            and run.spec.env.get(ADOPT_ENV) == u.mlflow_run_id
        )

    def _close(self, batch: Sequence[Ended | UnclosedMlflowRun]) -> list[Ended | UnclosedMlflowRun]:
        """Make the batch's closes; those to try again (MLflow is away), in order."""
        notes: list[MlflowNote] = []
        for i, e in enumerate(batch):
            with self._cond:
                self._cond.wait_for(lambda: not self._held or self._stop)
            if self.tracker.down:
                self.store.note_mlflow(notes)
                return list(batch[i:])
            closed: list[MlflowNote] | None
            if isinstance(e, UnclosedMlflowRun):
                closed = self.tracker.close_recovered(e, self.store.get(e.run_id))
            else:
                mlflow_id = self.tracker.ended(
                    e.run, e.outcome, e.end, e.mean_util, e.mlflow_run_id, e.lost_gpu_s
                )
                closed = None
                if mlflow_id is not None:
                    closed = [MlflowNote(e.run.id, e.run.attempt, "closed", mlflow_id)]
            with self._cond:
                self._done += 1
                self._cond.notify_all()
            if closed is not None:
                notes += closed
            elif self.tracker.down:  # (this one is tried again too)
                self.store.note_mlflow(notes)
                return list(batch[i:])
        self.store.note_mlflow(notes)
        return []
