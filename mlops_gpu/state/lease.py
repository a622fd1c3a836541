"""The scheduler's lease: leadership recorded in the store itself, with a fencing epoch.

One row in ``leader`` (id 1): who holds the lease (``holder``: host, pid and the process's start
time, so a reused pid is not taken for the holder, and a token of the ``LeaderLock`` object, so
two in one process exclude each other too), its ``epoch`` and until when it holds it
(``expires_at``, wall-clock seconds). Nothing outside the store can be removed to break it.

Invariants:
- Taking the lease is one write transaction (SQLite ``BEGIN IMMEDIATE``, a row lock on
  PostgreSQL): of two schedulers starting at once exactly one gets it.
- A lease is taken over only when it has expired, or its holder runs on this host and is gone;
  every take-over raises the epoch, so epochs only grow.
- Fencing: a store whose ``fence`` is set checks, in the same transaction as each of its writes,
  that the row still holds that epoch for it (``check``); a scheduler paused past its lease and
  then resumed finds its writes refused (``LeadershipLost``) once another has taken over, so no
  admission of a stale leader is ever committed.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from sqlalchemy import Connection, select

from mlops_gpu.state.errors import LeadershipLost
from mlops_gpu.state.schema import leader

ROW = 1
_HAS_PROC = os.path.exists("/proc/self/stat")


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) the lease, as the row says."""

    holder: str
    epoch: int
    expires_at: float
    pid: int
    host: str

    def alive(self, now: float) -> bool:
        """Whether the lease still binds: not expired, and (on this host) its process lives."""
        if self.expires_at <= now:
            return False
        if self.host == socket.gethostname():
            key = process_key(self.pid)
            return key is not None and self.holder.startswith(key + ":")
        return True


def process_key(pid: int) -> str | None:
    """``host:pid:start``, the start time from /proc (a reused pid has another); None when the
    process is gone or a zombie."""
    if not _HAS_PROC:  # (no /proc, e.g. macOS: whether the pid lives, without its start)
        try:
            os.kill(pid, 0)
        except PermissionError:
            pass  # another user's process: alive
        except OSError:
            return None
        return f"{socket.gethostname()}:{pid}:-"
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":  # exited, not yet reaped by its parent: gone (as heartbeat.pid_alive)
        return None
    return f"{socket.gethostname()}:{pid}:{fields[19].decode()}"


def new_holder() -> str:
    """A holder key for a new lock of this process: ``host:pid:start:token``."""
    key = process_key(os.getpid())
    assert key is not None
    return f"{key}:{uuid.uuid4().hex[:12]}"


def read(conn: Connection, lock: bool = False, share: bool = False) -> Holder | None:
    """The row; ``lock``/``share``: locked for update/share until commit (PostgreSQL; SQLite's
    write transactions hold the whole database already)."""
    q = select(leader).where(leader.c.id == ROW)
    if lock or share:
        q = q.with_for_update(read=share and not lock)
    row = conn.execute(q).first()
    if row is None:
        return None
    return Holder(row.holder, int(row.epoch), float(row.expires_at), int(row.pid), row.host)


def take(conn: Connection, mine: str, now: float, lease_s: float) -> int | None:
    """Take (or renew) the lease for holder ``mine``; its epoch, or None while another holds
    it."""
    cur = read(conn, lock=True)
    values = {"holder": mine, "expires_at": now + lease_s, "pid": os.getpid(),
              "host": socket.gethostname()}  # fmt: skip
    if cur is None:
        conn.execute(leader.insert().values(id=ROW, epoch=1, **values))
        return 1
    if cur.holder == mine and cur.expires_at > now:
        conn.execute(leader.update().where(leader.c.id == ROW).values(**values))
        return cur.epoch
    if cur.alive(now):
        return None
    epoch = cur.epoch + 1
    conn.execute(leader.update().where(leader.c.id == ROW).values(epoch=epoch, **values))
    return epoch


def renew(conn: Connection, fence: tuple[int, str], now: float, lease_s: float) -> None:
    """Extend the lease held as ``fence`` (epoch, holder); ``LeadershipLost`` if another took
    it over."""
    check(conn, fence)
    conn.execute(leader.update().where(leader.c.id == ROW).values(expires_at=now + lease_s))


def check(conn: Connection, fence: tuple[int, str]) -> None:
    """The fencing test of every write of a leader: the row still holds ``fence`` (its epoch
    and holder)."""
    epoch, mine = fence
    cur = read(conn, share=True)
    if cur is None or cur.epoch != epoch or cur.holder != mine:
        who = "nobody" if cur is None else f"epoch {cur.epoch} ({cur.holder})"
        raise LeadershipLost(
            f"this scheduler's lease (epoch {epoch}) was taken over by {who}: "
            "it stops admitting and exits"
        )


def give_up(conn: Connection, fence: tuple[int, str]) -> None:
    """End a lease we hold (a clean stop): the next scheduler takes over at once."""
    epoch, mine = fence
    conn.execute(
        leader.update()
        .where(leader.c.id == ROW, leader.c.epoch == epoch, leader.c.holder == mine)
        .values(expires_at=0.0)
    )
