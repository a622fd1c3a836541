"""``Controller``: the one control loop's state and its entry points.

A ``Controller`` holds what lives between ticks (the ``Mirror`` of the store, the leader lease,
the attempts already signalled, the launch failures in a row, the usage ledger read so far, the
MLflow tracking queue) and delegates each job to its module:
- ``reconcile``: at start-up, the store's active runs matched with the backends' jobs;
- ``tick``: one cycle, store -> core decision -> backends -> store (its steps are listed there),
  with ``poll`` (what the backends report: ends, starts, stop signals) and ``launch`` (admitted
  runs' jobs);
- ``daemon``: ``run_forever``, reconcile and then tick until stopped or idle;
- ``snapshot``: the core's input (``build_snapshot``, ``template``, ``usage_inputs``).

The controller keeps the usage ledger it has read and asks the store only for newer rows
(with a full re-read every ``LEDGER_RELOAD_S``), so a tick does not re-read the history.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from mlops_gpu.backends import LauncherSettings, warm
from mlops_gpu.controller import gate
from mlops_gpu.controller.daemon import run_forever as daemon_loop
from mlops_gpu.controller.mirror import Mirror
from mlops_gpu.controller.pools import PoolControl
from mlops_gpu.controller.reconcile import reconcile as reconcile_runs
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.controller.samples import GpuSamples
from mlops_gpu.controller.snapshot import build_snapshot, template, usage_inputs
from mlops_gpu.controller.tick import EXPLAIN_EVERY_TICK_UP_TO, TickReport
from mlops_gpu.controller.tick import tick as one_tick
from mlops_gpu.model import Run
from mlops_gpu.state import LeaderLock, LeadershipLost, UsageRow, observed
from mlops_gpu.tracking.close_queue import Ended, TrackingQueue
from mlops_gpu.tracking.tracker import Tracker

__all__ = [
    "EXPLAIN_EVERY_TICK_UP_TO",
    "Controller",
    "LeaderError",
    "TickReport",
    "build_snapshot",
    "template",
    "usage_inputs",
]

log = logging.getLogger("mlops_gpu.controller")

#: A full re-read of the ledger this often: ids from concurrent writers may commit out of order.
LEDGER_RELOAD_S = 60.0

EventSink = Callable[[str, Run | None, str], None]


class LeaderError(RuntimeError):
    """Another scheduler already runs against this store."""


class Controller:
    """The control loop's state between ticks (``tick``, ``poll``, ``launch``, ``reconcile`` and
    ``daemon`` act on it). One per store at a time: ``acquire`` takes the leader lease."""

    def __init__(
        self, rt: Runtime, clock: Callable[[], float] = time.time, on_event: EventSink | None = None
    ) -> None:
        self.rt = rt
        self.clock = clock
        self.on_event = on_event
        #: (run id, attempt) already sent its stop signal by this process (``poll.send_stop``)
        self._signalled: set[tuple[str, int]] = set()
        #: launches failed in a row per run (``launch``; the lifecycle fails it at the limit)
        self._launch_failures: dict[str, int] = defaultdict(int)
        self._lock: LeaderLock | None = None
        self._last_explain = float("-inf")
        self._ledger: list[UsageRow] = []
        self._ledger_id = 0
        self._ledger_read_at = float("-inf")
        self.mirror = Mirror(rt.store)
        uri = rt.cfg.tracking_uri(dict(os.environ)) if rt.cfg.mlflow.enabled else None
        root = rt.cfg.artifact_root(uri) if uri else None
        self.tracker = Tracker(uri, rt.cfg.model_gpu_types(), artifact_root=root)
        self.tracking = TrackingQueue(self.tracker, rt.store)
        t = rt.cfg.telemetry
        self.launcher = (
            LauncherSettings(t.interval_s, t.idle_below_pct, t.idle_after_s, t.stop_idle)
            if t.launcher
            else None
        )
        self._flagged_idle: set[tuple[str, int]] = set()
        #: attempts that ended this tick, their MLflow runs' closes queued at the tick's end
        self._ended: list[Ended] = []
        self._pool: ThreadPoolExecutor | None = None
        self._said: set[str] = set()
        #: Ticks poll the backends only if this long passed since the last poll: the daemon
        #: sets half its tick, so ticks woken early by a submit admit without listing every
        #: job again; 0 (a bare ``tick()``): every tick polls.
        self.min_poll_gap_s = 0.0
        self._polled_at = float("-inf")
        self._cold: set[str] = set()  # backends whose warm hook failed last time
        self._tracker_warm = False
        #: admitted runs held back until their devices' jobs exit
        self.gate = gate.Gate(rt.store, self.clock, self._emit)
        #: this process's cycle latencies (seconds per ``tick``), for metrics
        self.cycles = observed.Histogram(observed.CYCLE_BUCKETS)
        #: the launchers' last GPU samples, published for metrics
        self.samples = GpuSamples(rt.store)
        #: elastic pools: powered-down nodes offered to the core when a boot is worth it
        self.pools = PoolControl(rt)

    # -- leadership ---------------------------------------------------------------------
    def acquire(self) -> None:
        lock = LeaderLock(self.rt.store, self.rt.cfg.scheduler.lease)
        if not lock.acquire():
            raise LeaderError(f"another scheduler is running against {self.rt.cfg.store_url}")
        self._lock = lock

    def _renew(self) -> None:
        """Renew the lease before the tick writes anything; a scheduler replaced while it was
        stopped learns it here (or at its first write) and stops (``LeaderError``)."""
        if self._lock is not None:
            self._lock.renew()  # (LeadershipLost: ``tick`` turns it into LeaderError)

    def release(self) -> None:
        self.tracking.close()  # (what it cannot close in time, the next start's reconcile does)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _emit(self, kind: str, run: Run | None, msg: str) -> None:
        log.info("%s %s %s", kind, run.id if run else "-", msg)
        if self.on_event is not None:
            self.on_event(kind, run, msg)

    # -- start-up -------------------------------------------------------------------------
    def warm(self) -> None:
        """Each backend's optional ``warm`` hook (ready before the work comes: a burst of runs
        submitted to a daemon just started must not wait for a client's imports). A failure is
        logged once, never raised: the tick that needs the backend reports it. The MLflow
        store is opened beside (``Tracker.warm``, once)."""
        if not self._tracker_warm:
            self._tracker_warm = True
            self.tracker.warm()
        for name, backend in self.rt.backends.items():
            try:
                warm(backend)
            except Exception as e:
                if name not in self._cold:
                    log.warning("backend %s is not ready: %s", name, e)
                self._cold.add(name)
            else:
                self._cold.discard(name)

    def reconcile(self) -> int:
        """Match runs the store calls active with the backends' jobs; returns runs repaired
        (``reconcile``)."""
        return reconcile_runs(self)

    # -- the tick -------------------------------------------------------------------------
    def tick(self) -> TickReport:
        t0 = time.perf_counter()
        try:
            self._renew()
            return one_tick(self)
        except LeadershipLost as e:  # at the renewal or fenced at a write: another leads now
            self.mirror.reset()
            if self._lock is not None:
                self._lock.epoch = None  # (nothing to give up: it is another's now)
                self._lock = None
            raise LeaderError(str(e)) from e
        except BaseException:
            self.mirror.reset()  # whatever the engine applied may not have reached the store
            self._flush_tracking()  # what did end is queued for its MLflow close all the same
            raise
        finally:  # every cycle, failed ones too (the daemon publishes it: ``observed``)
            self.cycles.observe(time.perf_counter() - t0)

    def _flush_tracking(self) -> None:
        """Queue the closes of the MLflow runs of attempts that ended this tick: the tracking
        worker makes them (``tracking.close_queue``), so MLflow's writes never delay a tick."""
        ended, self._ended = self._ended, []
        self.tracking.put(ended)

    def drain_tracking(self, timeout_s: float = 30.0) -> bool:
        """Wait until the MLflow runs of the attempts that ended so far are closed."""
        return self.tracking.drain(timeout_s)

    def _ledger_rows(self, since: float) -> list[UsageRow]:
        """The ledger rows ending at or after ``since``: new rows added to those already read."""
        store, now = self.rt.store, time.monotonic()
        if now - self._ledger_read_at >= LEDGER_RELOAD_S:
            self._ledger, self._ledger_read_at = store.usage(since=since), now
        else:
            self._ledger += store.usage(since=since, after_id=self._ledger_id)
        if self._ledger:
            self._ledger_id = max(self._ledger_id, self._ledger[-1].id)
        self._ledger = [r for r in self._ledger if r.end >= since]
        return self._ledger

    def _say_once(self, msg: str) -> None:
        """A warning logged once per distinct message (a cluster down for an hour would
        otherwise log every tick)."""
        if msg not in self._said:
            self._said.add(msg)
            log.warning("%s", msg)

    # -- the daemon -----------------------------------------------------------------------
    def run_forever(
        self,
        *,
        tick_s: float | None = None,
        idle_exit_s: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        after_tick: Callable[[TickReport], None] | None = None,
    ) -> None:
        """Reconcile, then tick until ``should_stop`` or idle for ``idle_exit_s`` (``daemon``)."""
        daemon_loop(
            self,
            tick_s=tick_s,
            idle_exit_s=idle_exit_s,
            should_stop=should_stop,
            after_tick=after_tick,
        )
