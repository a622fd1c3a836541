"""The scheduler as a service: what the daemon does after each tick (publish its status in the
store, follow its config file), and ``SchedulerThread``, the control loop inside another
process (``mlops-gpu server``) that leads when it holds the store's lease and stands by when
another process does.

Invariants:
- Leadership is the store's lease only (``state.lock``): a thread that cannot take it runs
  nothing and tries again every ``standby_s``; one that loses it (``LeaderError``) stops ticking
  at once and stands by again. Of several servers on one store, exactly one schedules.
- The loop runs on its own ``Runtime`` (its own store connection, whose writes are fenced by the
  lease); requests served beside it use another, which is never fenced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from mlops_gpu.config.pools import acted_on, not_acted_on
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.state import heartbeat as hb
from mlops_gpu.state import observed

log = logging.getLogger("mlops_gpu")


def publish_and_follow(ctl: Any, idle_exit: float | None) -> tuple[Callable[[Any], None], Any]:
    """Publish this scheduler's status and return (what runs after each tick: reload the config
    if its file changed, beat at most every second (with the cycle-latency histogram,
    ``state.observed``); the ``ConfigWatch`` or None, for a SIGHUP
    hook by the caller)."""
    from importlib.metadata import PackageNotFoundError, version

    from mlops_gpu.controller.config_watch import ConfigWatch, apply
    from mlops_gpu.engines.native import NativeEngine

    rt = ctl.rt
    watch = ConfigWatch(rt.cfg) if rt.cfg.source is not None else None
    try:
        ver: str | None = version("mlops-gpu")
    except PackageNotFoundError:
        ver = None
    v = watch.version if watch is not None else None
    hb.publish_start(
        rt.store,
        idle_exit_s=idle_exit,
        config_path=str(watch.path) if watch is not None else None,
        config_hash=v.sha256 if v else None,
        config_mtime=v.mtime if v else None,
        version=ver,
    )
    ticks, beat_at, error = 0, float("-inf"), None

    def after_tick(_rep: Any) -> None:
        nonlocal ticks, beat_at, error
        ticks += 1
        now = time.time()
        if watch is not None:
            new = watch.check()
            loaded = watch.version
            if new is not None and loaded is not None:
                apply(ctl, new)
                quietly(lambda: hb.publish_config(
                    rt.store, config_hash=loaded.sha256, config_mtime=loaded.mtime,
                    restart=watch.restart_needed))  # fmt: skip
                error = None
            elif watch.error != error:
                error = watch.error
                quietly(lambda: hb.publish_config_error(rt.store, error))
        if now - beat_at >= hb.BEAT_S:
            beat_at = now
            engine = ctl.mirror.engine
            name = None if engine is None else (
                "native" if isinstance(engine, NativeEngine) else "reference")  # fmt: skip
            quietly(lambda: hb.beat(rt.store, tick_at=now, ticks=ticks, engine=name))
            quietly(lambda: observed.publish_cycles(rt.store, ctl.cycles, now))

    return after_tick, watch


def quietly(fn: Callable[[], Any]) -> None:
    """A status write that failed (store busy past its timeout) is logged, never fatal: the
    next beat writes it again."""
    try:
        fn()
    except Exception as e:
        log.warning("could not publish the scheduler status: %s", e)


class SchedulerThread:
    """The control loop in a daemon thread: it leads while it holds the store's lease, else it
    stands by and tries again every ``standby_s``. ``stop()`` ends it after its tick."""

    def __init__(self, rt: Runtime, standby_s: float = 1.0) -> None:
        self.rt = rt
        self.standby_s = standby_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="mlops-gpu-scheduler", daemon=True)
        #: ``leader`` while this thread schedules, ``standby`` while another process does,
        #: ``stopped`` after ``stop()``
        self.role = "standby"

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self.role = "stopped"

    def _main(self) -> None:
        from mlops_gpu.controller.loop import Controller, LeaderError
        from mlops_gpu.state.lock import current_holder

        while not self._stop.is_set():
            try:
                if current_holder(self.rt.store) is not None:
                    self._stop.wait(self.standby_s)
                    continue
                ctl = Controller(self.rt)
                try:
                    ctl.acquire()
                except LeaderError:
                    self._stop.wait(self.standby_s)
                    continue
                self._lead(ctl)
            except Exception:  # a store outage: logged, and tried again
                self.role = "standby"
                log.exception("scheduler: tick failed; standing by")
                self._stop.wait(self.standby_s)

    def _lead(self, ctl: Any) -> None:
        from mlops_gpu.controller.loop import LeaderError

        self.role = "leader"
        log.info("scheduler: leading for %s", self.rt.cfg.store_url)
        if names := acted_on(self.rt.cfg.pools, self.rt.cfg.backends):
            log.info("scheduler: pools %s: nodes booted for runs through Slurm's power saving "
                     "or a Kubernetes autoscaler's placeholder pods", ", ".join(names))  # fmt: skip
        if (note := not_acted_on(self.rt.cfg.pools, self.rt.cfg.backends)) is not None:
            log.warning("scheduler: %s", note)  # pools of backends without power control (README)
        try:
            after_tick, _watch = publish_and_follow(ctl, None)
            ctl.warm()
            ctl.run_forever(should_stop=self._stop.is_set, after_tick=after_tick)
        except LeaderError as e:  # replaced while paused: fenced; stand by again
            log.error("%s", e)
        finally:
            self.role = "standby"
            quietly(lambda: hb.publish_stop(self.rt.store))
            ctl.release()
