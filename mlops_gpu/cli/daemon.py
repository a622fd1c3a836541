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
from typing import Any

from mlops_gpu.cli.safe_text import visible
from mlops_gpu.state import heartbeat as hb


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
    """``controller.service.publish_and_follow``, with SIGHUP hooked to a config re-read."""
    from mlops_gpu.controller.service import publish_and_follow

    after_tick, watch = publish_and_follow(ctl, idle_exit)
    if watch is not None:
        signal.signal(signal.SIGHUP, lambda _s, _f: watch.request())
    return after_tick


def _quietly(fn: Any) -> None:
    from mlops_gpu.controller.service import quietly

    quietly(fn)
