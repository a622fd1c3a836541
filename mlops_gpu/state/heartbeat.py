"""What the running scheduler publishes about itself, for other processes to read
(``mlops-gpu scheduler status``, ``queue``, ``status``, ``scheduler stop``).

One row of ``scheduler_status`` (``id`` 1), written only by the scheduler that holds the
leader lock: its pid and host, when it started, its last tick, the engine in use, the config
file it runs and that file's version. It never decides who leads (the leader lock does); it
says who does, so reading it takes no lock and cannot disturb a scheduler starting meanwhile.

Invariants:
- These writes never raise the store revision: a heartbeat does not wake the scheduler.
- A row whose ``stopped_at`` is set, or whose pid is gone (same host) or whose beat is older
  than ``STALE_S`` (another host), is a scheduler that is not running (``is_running``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select

from mlops_gpu.state.schema import scheduler_status
from mlops_gpu.state.store import Store

_ID = 1
#: A scheduler on another host whose last beat is older than this is taken as gone (its pid
#: cannot be checked from here). A live scheduler beats at least every ``BEAT_S``.
STALE_S = 60.0
#: The least time between two beats (a tick woken by every submit would otherwise write).
BEAT_S = 1.0


@dataclass(frozen=True)
class SchedulerInfo:
    pid: int
    host: str
    started_at: float
    beat_at: float
    tick_at: float | None
    ticks: int
    engine: str | None
    idle_exit_s: float | None
    config_path: str | None
    config_hash: str | None
    config_mtime: float | None
    config_loaded_at: float | None
    config_error: str | None
    config_restart: str | None
    version: str | None
    stopped_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def publish_start(
    store: Store,
    *,
    idle_exit_s: float | None,
    config_path: str | None,
    config_hash: str | None,
    config_mtime: float | None,
    version: str | None,
    now: float | None = None,
) -> None:
    """The scheduler that just took the leader lock: replaces whatever an earlier one left."""
    t = time.time() if now is None else now
    row = dict(
        pid=os.getpid(),
        host=socket.gethostname(),
        started_at=t,
        beat_at=t,
        tick_at=None,
        ticks=0,
        engine=None,
        idle_exit_s=idle_exit_s,
        config_path=config_path,
        config_hash=config_hash,
        config_mtime=config_mtime,
        config_loaded_at=t,
        config_error=None,
        config_restart=None,
        version=version,
        stopped_at=None,
    )
    with store.engine.begin() as conn:
        conn.execute(scheduler_status.delete())
        conn.execute(scheduler_status.insert().values(id=_ID, **row))


def beat(store: Store, *, tick_at: float, ticks: int, engine: str | None) -> None:
    _update(store, beat_at=time.time(), tick_at=tick_at, ticks=ticks, engine=engine)


def publish_config(
    store: Store, *, config_hash: str, config_mtime: float, restart: Sequence[str] = ()
) -> None:
    """A config version loaded (the last refusal cleared); ``restart``: the restart-only
    sections it changed, which wait for a restart."""
    _update(store, config_hash=config_hash, config_mtime=config_mtime,
            config_loaded_at=time.time(), config_error=None,
            config_restart=", ".join(restart) or None)  # fmt: skip


def publish_config_error(store: Store, error: str | None) -> None:
    """The file's latest version was refused (``error``: the one-line reason), or no longer
    is (None); the loaded version stays."""
    _update(store, config_error=error)


def publish_stop(store: Store) -> None:
    _update(store, stopped_at=time.time())


def _update(store: Store, **values: Any) -> None:
    with store.engine.begin() as conn:  # only this process's own row
        conn.execute(
            scheduler_status.update()
            .where(scheduler_status.c.id == _ID, scheduler_status.c.pid == os.getpid())
            .values(**values)
        )


def read(store: Store) -> SchedulerInfo | None:
    """The row the last scheduler left, running or not (None: no scheduler ever published)."""
    with store.engine.connect().execution_options(readonly=True) as conn, conn.begin():
        row = conn.execute(select(scheduler_status).where(scheduler_status.c.id == _ID)).first()
    if row is None:
        return None
    fields = {k: getattr(row, k) for k in SchedulerInfo.__dataclass_fields__}
    return SchedulerInfo(**fields)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live mlops-gpu process on this host (a zombie, exited but not yet
    reaped by its parent, is not; nor is another program that was given the pid since)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, IndexError):
        return True  # no /proc: kill(0) said it exists
    # a pid reused by another program after the scheduler died is not the scheduler
    return b"mlops_gpu" in cmdline or b"mlops-gpu" in cmdline


def is_running(info: SchedulerInfo | None, now: float | None = None) -> bool:
    if info is None or info.stopped_at is not None:
        return False
    if info.host == socket.gethostname():
        return pid_alive(info.pid)
    return (time.time() if now is None else now) - info.beat_at < STALE_S
