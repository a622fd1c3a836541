"""``mlops-gpu scheduler``: the control loop in the foreground, stopped cleanly by SIGTERM or
Ctrl-C (runs keep running in their own sessions and are picked up by the next start)."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any


def run_scheduler(
    rt: Any, *, once: bool, idle_exit: float | None, quiet_if_running: bool, verbose: bool
) -> int:
    from mlops_gpu.controller import Controller
    from mlops_gpu.controller.loop import LeaderError

    logging.basicConfig(
        level=logging.INFO if verbose or not once else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
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
        ctl.warm()  # "started" means ready: the first submit does not wait for connections
        logging.getLogger("mlops_gpu").info("scheduler started for %s", rt.cfg.store_url)
        ctl.run_forever(idle_exit_s=idle_exit, should_stop=lambda: stop["flag"])
        return 0
    finally:
        ctl.release()
