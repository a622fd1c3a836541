"""Opening the database behind a ``Store``: SQLAlchemy engines for SQLite and PostgreSQL.

SQLite connections are pooled, in WAL mode, and every write transaction starts with
``BEGIN IMMEDIATE`` (the write lock taken up front: read-then-write never deadlocks, concurrent
writers queue on ``busy_timeout``); a forked child drops the parent's pooled connections without
closing them. PostgreSQL keeps 10 connections open and fails a dead server's open in seconds.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from mlops_gpu.state.migrations import migrate

_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
#: How long a SQLite writer waits for another's write lock before "database is locked" (the
#: CLI's one-line error names it: ``cli.errors``).
BUSY_TIMEOUT_S = 120


def _after_fork() -> None:
    for eng in list(_ENGINES):
        eng.dispose(close=False)


os.register_at_fork(after_in_child=_after_fork)


def engine_for(url: str) -> Engine:
    if url.startswith("sqlite"):
        # Pooled connections: opening one (and its PRAGMAs) per transaction cost about a
        # millisecond, several times per admitted run. A forked child drops the parent's pooled
        # connections without closing them (``_after_fork``), as SQLAlchemy advises.
        eng = create_engine(
            url, connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False}
        )
        _ENGINES.add(eng)

        @event.listens_for(eng, "connect")
        def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(eng, "begin")
        def _on_begin(conn: Connection) -> None:
            ro = conn.get_execution_options().get("readonly", False)
            conn.exec_driver_sql("BEGIN" if ro else "BEGIN IMMEDIATE")

        return eng
    # A server that does not answer fails the open in seconds, not after TCP's minutes (unless
    # the URL sets its own connect_timeout).
    args = {} if "connect_timeout" in make_url(url).query else {"connect_timeout": 10}
    # all 10 kept open once opened: with 2 kept (4 more allowed), a server's bursts (identity
    # reads) connected and closed the rest each time, a PostgreSQL backend started for each
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=0, connect_args=args)


def build_new(path: str) -> None:
    eng = engine_for("sqlite:///" + path)
    try:
        with eng.begin() as conn:
            migrate(conn)
    finally:
        eng.dispose()  # the last connection out folds the WAL into the file
