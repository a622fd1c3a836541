"""The scheduler daemon: its loop (``run_forever``: reconcile, then tick until stopped or idle),
and starting it on demand, for the embedded default (SDK and CLI submits).

``ensure_scheduler`` starts ``mlops-gpu scheduler --idle-exit S`` in its own session when no
scheduler holds the store's lease (``state.lock``). Two callers racing both may spawn one: the
loser finds the lease taken and exits at once, so at most one scheduler ever runs. A submit starts
it before it stores its run (``Runtime.submit``), so a scheduler that cannot start stores no run.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mlops_gpu.controller.prepare import unwritable
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.controller.tick import TickReport
from mlops_gpu.state import ConflictError, SetupError
from mlops_gpu.state.lock import current_holder

if TYPE_CHECKING:
    from mlops_gpu.controller.loop import Controller

log = logging.getLogger("mlops_gpu.controller")


def scheduler_running(rt: Runtime) -> bool:
    """Whether a scheduler holds the store's lease now (read only: asking takes nothing)."""
    return current_holder(rt.store) is not None


def ensure_scheduler(rt: Runtime) -> bool:
    """Start a background scheduler if none runs; True if one was started."""
    if scheduler_running(rt):
        return False
    start_background(rt, rt.cfg.scheduler.idle_exit_s)
    return True


def start_background(rt: Runtime, idle_exit_s: float | None) -> int:
    """Start ``mlops-gpu scheduler`` in its own session, logging to ``STATE/scheduler.log``
    (``idle_exit_s`` None: it runs until stopped); its pid. It exits at once, quietly, if
    another scheduler holds the store's leader lock."""
    source = rt.cfg.source
    if source is None:
        raise RuntimeError("cannot start a scheduler for a config that has no file")
    state = rt.cfg.state_path
    cmd = [
        sys.executable,
        "-m",
        "mlops_gpu.cli.main",
        "--config",
        str(Path(source).resolve()),
        "scheduler",
        *(["--idle-exit", str(idle_exit_s)] if idle_exit_s is not None else []),
        "--quiet-if-running",
    ]
    try:
        state.mkdir(parents=True, exist_ok=True)
        with open(state / "scheduler.log", "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
    except OSError as e:
        raise SetupError(f"cannot start the scheduler: {unwritable(rt.cfg, state, e)}") from None
    return proc.pid


def run_forever(
    ctl: Controller,
    *,
    tick_s: float | None = None,
    idle_exit_s: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    after_tick: Callable[[TickReport], None] | None = None,
) -> None:
    """Reconcile, then tick until ``should_stop`` or (if set) idle for ``idle_exit_s``:
    nothing active and nothing pending but runs that are ``invalid`` under the config
    (they wait for a config that names their project or class; the next submit or
    ``mlops-gpu scheduler`` starts a scheduler that reads it). ``after_tick``: called
    after each tick (the daemon's heartbeat and config reload)."""
    tick_s = tick_s or ctl.rt.cfg.scheduler.tick_s
    wake_s = ctl.rt.cfg.scheduler.wake_s
    ctl.min_poll_gap_s = tick_s / 2 if wake_s > 0 else 0.0
    ctl.reconcile()
    idle_since: float | None = None
    while not should_stop():
        t0 = time.monotonic()
        ctl.warm()  # (cheap when warm; keeps watches going while idle)
        try:
            rep = ctl.tick()
        except ConflictError as e:  # a concurrent user change; the next tick sees it
            log.warning("tick conflict: %s", e)
            rep = TickReport(pending=1)
        if after_tick is not None:
            after_tick(rep)
        if rep.pending > rep.invalid or rep.active:
            idle_since = None
        elif idle_exit_s is not None:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= idle_exit_s:
                left = f"; {rep.invalid} invalid runs wait" if rep.invalid else ""
                log.info("idle for %.0fs: exiting%s", idle_exit_s, left)
                return
        _wait(ctl, t0 + tick_s, wake_s, should_stop)


def _wait(ctl: Controller, until: float, wake_s: float, should_stop: Callable[[], bool]) -> None:
    """Sleep until ``until``, or less: until the store revision moves past the one this tick
    left (a submit or a cancel from another process), checked every ``wake_s``."""
    if wake_s <= 0:
        time.sleep(max(0.0, until - time.monotonic()))
        return
    rev = ctl.rt.store.revision()
    while (left := until - time.monotonic()) > 0 and not should_stop():
        time.sleep(min(wake_s, left))
        if ctl.rt.store.revision() != rev:
            return
