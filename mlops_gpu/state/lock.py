"""``LeaderLock``: at most one scheduler per store, recorded in the store itself.

Leadership is the store's lease row (``lease.py``): taken in one write transaction, renewed by
the leader every tick, taken over only once it has expired or its holder (on this host) is gone,
each take-over with a higher epoch. No file beside the store holds it (the lock file of earlier
versions could be deleted, letting a second leader start), on SQLite and PostgreSQL alike. A
holder on this host that has exited is replaced at once; any other only once its lease expired.

While it holds the lease the lock sets ``store.fence``: every write of that store checks the
epoch in its own transaction, so a leader that was paused past its lease and replaced commits
nothing more (``LeadershipLost``), and no device is ever booked by two leaders.
"""

from __future__ import annotations

import time

from sqlalchemy.exc import IntegrityError

from mlops_gpu.state import lease
from mlops_gpu.state.lease import Holder
from mlops_gpu.state.store import Store

#: Seconds a lease lasts without renewal. The leader renews it every tick (about a second);
#: a scheduler stopped longer than this may be replaced.
LEASE_S = 30.0


class LeaderLock:
    """At most one scheduler per store (the store's lease row). Released by ``release()``,
    or taken over once the holder has died or its lease has expired."""

    def __init__(self, store: Store, lease_s: float = LEASE_S) -> None:
        self.store = store
        self.lease_s = lease_s
        self.holder = lease.new_holder()
        self.epoch: int | None = None

    def acquire(self) -> bool:
        if self.epoch is not None:
            return True  # already ours
        try:
            with self.store.engine.begin() as conn:
                epoch = lease.take(conn, self.holder, time.time(), self.lease_s)
        except IntegrityError:
            return False  # (PostgreSQL) another scheduler wrote the first lease row meanwhile
        if epoch is None:
            return False
        self.epoch = epoch
        self.store.fence = (epoch, self.holder)
        return True

    def renew(self) -> None:
        """Extend the lease (each tick); ``LeadershipLost`` once another scheduler took over."""
        assert self.epoch is not None
        with self.store.engine.begin() as conn:
            lease.renew(conn, (self.epoch, self.holder), time.time(), self.lease_s)

    def release(self) -> None:
        if self.epoch is not None:
            epoch, self.epoch = self.epoch, None
            self.store.fence = None
            try:
                with self.store.engine.begin() as conn:
                    lease.give_up(conn, (epoch, self.holder))
            except Exception:
                pass


def current_holder(store: Store) -> Holder | None:
    """The scheduler that holds the store's lease now, or None (no lease, expired, or its
    process on this host is gone)."""
    with store.engine.connect().execution_options(readonly=True) as conn, conn.begin():
        holder = lease.read(conn)  # (a read: no write lock, whatever the leader is doing)
    if holder is None or not holder.alive(time.time()):
        return None
    return holder
