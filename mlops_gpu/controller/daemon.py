"""Starting the scheduler daemon on demand, for the embedded default (SDK and CLI submits).

``ensure_scheduler`` starts ``mlops-gpu scheduler --idle-exit S`` in its own session when no
scheduler holds the store's lease (``state.lock``). Two callers racing both may spawn one: the
loser finds the lease taken and exits at once, so at most one scheduler ever runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.state.lock import current_holder


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
    state.mkdir(parents=True, exist_ok=True)
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
    with open(state / "scheduler.log", "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid
