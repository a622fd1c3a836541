"""One thread that makes every MLflow call of the scheduler; callers wait for an answer only up to
a deadline, so MLflow runs beside scheduling and never holds a tick or a stop.

MLflow can take long to answer: its SQLite store retries opening a file for about 100 s
(``mlflow.store.db.utils``, ten attempts, not configurable), the first ``import mlflow`` and
a new store's migrations take seconds, and a server that does not answer costs a timeout per
call. Here a caller (the tick's launches, the tracking queue's worker) queues the call and waits
``timeout`` seconds at most; past that it gets ``TrackingUnavailable`` and goes on, and the call
still runs later, its result going to ``on_late`` (an attempt's MLflow run made after its launch
is still noted and closed).

Invariants:
- Calls run one at a time, first in first out: a close queued after a create runs after it.
- The thread is a daemon: a call stuck inside MLflow never keeps the process from exiting.
- A call's result goes to exactly one of its waiter and its ``on_late`` (decided under a lock).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from mlops_gpu.tracking.rest import TrackingUnavailable

log = logging.getLogger("mlops_gpu.tracking")


class _Call:
    __slots__ = ("abandoned", "done", "error", "fn", "on_late", "queued", "result")

    def __init__(self, fn: Callable[[], Any], on_late: Callable[[Any], None] | None) -> None:
        self.fn, self.on_late = fn, on_late
        self.queued = time.monotonic()
        self.done = False
        self.abandoned = False
        self.result: Any = None
        self.error: BaseException | None = None


class MlflowThread:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls: deque[_Call] = deque()
        self._current: _Call | None = None
        self._thread: threading.Thread | None = None

    def call(
        self,
        fn: Callable[[], Any],
        timeout_s: float,
        on_late: Callable[[Any], None] | None = None,
    ) -> Any:
        """``fn()``'s result (its exception raised here), or ``TrackingUnavailable`` after
        ``timeout_s`` (0: do not wait at all); then ``on_late`` gets the result when it comes."""
        c = _Call(fn, on_late)
        with self._cond:
            self._calls.append(c)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="mlflow", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: c.done, timeout_s):
                c.abandoned = True
                raise TrackingUnavailable(f"MLflow did not answer within {timeout_s:g} s")
        if c.error is not None:
            raise c.error
        return c.result

    def submit(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` and do not wait (its errors are its own to report)."""
        with contextlib.suppress(TrackingUnavailable):
            self.call(fn, 0)

    def backlog_s(self) -> float:
        """How long the oldest call not yet answered has waited (0: none waits)."""
        with self._cond:
            oldest = self._current or (self._calls[0] if self._calls else None)
            return 0.0 if oldest is None else time.monotonic() - oldest.queued

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._calls))
                c = self._current = self._calls.popleft()
            result: Any = None
            error: BaseException | None = None
            try:
                result = c.fn()
            except Exception as e:
                error = e
            with self._cond:
                c.result, c.error, c.done = result, error, True
                self._current = None
                late = c.abandoned
                self._cond.notify_all()
            if late and error is None and c.on_late is not None:
                try:
                    c.on_late(result)
                except Exception:  # never let the thread die
                    log.exception("MLflow: handling a late answer failed")
