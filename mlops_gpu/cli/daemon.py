"""``mlops-gpu scheduler``: the control loop in the foreground, stopped cleanly by SIGTERM or
Ctrl-C (runs keep running in their own sessions and are picked up by the next start).

While it runs it publishes its status in the store (``state.heartbeat``: pid, start, last
tick, engine, config version; ``state.observed``: its cycle-latency histogram), and follows its
config file (``controller.config_watch``): re-read when the file changes or on SIGHUP, applied
at the next tick once it validates.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from typing import Any

from mlops_gpu.cli.safe_text import visible
from mlops_gpu.state import heartbeat as hb
from mlops_gpu.state import observed


class _VisibleFormatter(logging.Formatter):
    """Log lines name runs, projects and nodes (users' strings): one line each, with control
    characters escaped (``safe_text``); a traceback keeps its line breaks."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record))


def run_scheduler(
    rt: Any, *, once: bool, idle_exit: float | None, quiet_if_running: bool, verbose: bool
) -> int:
    from mlops_gpu.controller import Controller
    from mlops_gpu.controller.loop import LeaderError

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_VisibleFormatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose or not once else logging.WARNING,
                        handlers=[handler])  # fmt: skip
    rt.store.check_pages()  # a damaged store is refused before the loop writes to it
    ctl = Controller(rt)
    try:
        ctl.acquire()
    except LeaderError as e:
        if quiet_if_running:
            return 0
        print(f"mlops-gpu: error: {e}", file=sys.stderr)
        return 1
    stop = {"flag": False}

    def _stop(signum: int, _frame: Any) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        if once:
            ctl.reconcile()
            rep = ctl.tick()
            print(
                f"admitted {rep.admitted}, finished {rep.finished}, requeued {rep.requeued}, "
                f"pending {rep.pending}",
                file=sys.stderr,
            )
            return 0
        after_tick = _publish_and_follow(ctl, idle_exit)
        ctl.warm()  # "started" means ready: the first submit does not wait for connections
        logging.getLogger("mlops_gpu").info("scheduler started for %s", rt.cfg.store_url)
        try:
            ctl.run_forever(
                idle_exit_s=idle_exit, should_stop=lambda: stop["flag"], after_tick=after_tick
            )
        except LeaderError as e:  # replaced while stopped or hung: fenced, it must go
            logging.getLogger("mlops_gpu").error("%s", e)
            print(f"mlops-gpu: error: {e}", file=sys.stderr)
            return 3
        finally:
            _quietly(lambda: hb.publish_stop(rt.store))  # (refused once fenced: not ours)
        return 0
    finally:
        ctl.release()


def _publish_and_follow(ctl: Any, idle_exit: float | None) -> Any:
    """Publish this scheduler's status, hook SIGHUP to a config re-read, and return what runs
    after each tick: reload the config if its file changed, beat (at most every second)."""
    from importlib.metadata import PackageNotFoundError, version

    from mlops_gpu.controller.config_watch import ConfigWatch, apply
    from mlops_gpu.core.native import NativeEngine

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
    if watch is not None:
        signal.signal(signal.SIGHUP, lambda _s, _f: watch.request())
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
                _quietly(lambda: hb.publish_config(
                    rt.store, config_hash=loaded.sha256, config_mtime=loaded.mtime,
                    restart=watch.restart_needed))  # fmt: skip
                error = None
            elif watch.error != error:
                error = watch.error
                _quietly(lambda: hb.publish_config_error(rt.store, error))
        if now - beat_at >= hb.BEAT_S:
            beat_at = now
            engine = ctl.mirror.engine
            name = None if engine is None else (
                "native" if isinstance(engine, NativeEngine) else "python")  # fmt: skip
            _quietly(lambda: hb.beat(rt.store, tick_at=now, ticks=ticks, engine=name))
            _quietly(lambda: observed.publish_cycles(rt.store, ctl.cycles, now))

    return after_tick


def _quietly(fn: Any) -> None:
    """A status write that failed (store busy past its timeout) is logged, never fatal: the
    next beat writes it again."""
    try:
        fn()
    except Exception as e:
        logging.getLogger("mlops_gpu").warning("could not publish the scheduler status: %s", e)
