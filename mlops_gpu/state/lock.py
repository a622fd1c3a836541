"""``LeaderLock``: at most one scheduler per store.

Beside a SQLite file it is an ``flock`` on ``<db>.scheduler.lock`` (the holder's pid is written
in it); on PostgreSQL a session advisory lock on a connection held for as long as the lock.
Either is released by ``release()`` or by the holding process dying. A lock file that cannot be
opened is a one-line ``StoreError``.
"""

from __future__ import annotations

import fcntl
import os

from sqlalchemy import Connection, text

from mlops_gpu.state.errors import StoreError
from mlops_gpu.state.store import Store


class LeaderLock:
    """At most one scheduler per store: ``flock`` beside a SQLite file, a PostgreSQL session
    advisory lock otherwise. Released by ``release()`` or by the process dying."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._fd: int | None = None
        self._conn: Connection | None = None

    def acquire(self) -> bool:
        if self._fd is not None or self._conn is not None:
            return True  # already ours
        if self.store.dialect == "sqlite":
            path = self.store.url.split("///", 1)[1] + ".scheduler.lock"
            try:
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise StoreError(
                    path,
                    f"cannot be opened ({e.strerror})",
                    "make the store's folder writable by this user",
                ) from None
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._fd)
                self._fd = None
                return False
            os.ftruncate(self._fd, 0)
            os.write(self._fd, str(os.getpid()).encode())
            return True
        self._conn = self.store.engine.connect()
        got = bool(self._conn.execute(text("SELECT pg_try_advisory_lock(727275)")).scalar())
        self._conn.commit()
        if not got:
            self._conn.close()
            self._conn = None
        return got

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._conn is not None:
            # Session-level advisory locks outlive close() on a pooled connection: unlock
            # explicitly before handing the connection back.
            self._conn.execute(text("SELECT pg_advisory_unlock(727275)"))
            self._conn.commit()
            self._conn.close()
            self._conn = None
