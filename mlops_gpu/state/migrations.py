"""Versioned migrations of the store's tables (``state.schema``).

``migrate`` runs the missing steps in order inside one transaction that holds the database's
write lock (SQLite ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock), so processes opening a new
store at once migrate it exactly once. Never edit a released step: add a new one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, Table, inspect, text

from mlops_gpu.model import ACTIVE_PHASES
from mlops_gpu.state import mlflow_legacy
from mlops_gpu.state.schema import (
    audit,
    events,
    gpu_samples,
    leader,
    memberships,
    mlflow_runs,
    revision,
    runs,
    scheduler_cycles,
    scheduler_status,
    schema_version,
    tokens,
    usage,
    users,
)


def _v1(conn: Connection) -> None:
    # Creates missing tables at the *latest* definition; later steps therefore only add what
    # an older store lacks, and check before adding.
    for t in (runs, events, usage):
        t.create(conn, checkfirst=True)


def _add_missing_columns(conn: Connection, table: Table, names: list[str]) -> None:
    have = {c["name"] for c in inspect(conn).get_columns(table.name)}
    for name in names:
        if name in have:
            continue
        col = table.c[name]
        ddl = f"ALTER TABLE {table.name} ADD COLUMN {name} {col.type.compile(conn.dialect)}"
        if col.server_default is not None:
            ddl += f" NOT NULL DEFAULT {col.server_default.arg}"  # type: ignore[attr-defined]
        conn.execute(text(ddl))


def _v2(conn: Connection) -> None:
    _add_missing_columns(conn, runs, ["attained_gpu_s", "not_before"])


def _v3(conn: Connection) -> None:
    _add_missing_columns(conn, runs, ["rev"])
    have = {ix["name"] for ix in inspect(conn).get_indexes("runs")}
    if "ix_runs_rev" not in have:
        conn.execute(text("CREATE INDEX ix_runs_rev ON runs (rev)"))
    revision.create(conn, checkfirst=True)
    if conn.execute(revision.select()).first() is None:
        conn.execute(revision.insert().values(value=0))


def _v4(conn: Connection) -> None:
    _add_missing_columns(conn, runs, ["queued_at"])
    _add_missing_columns(conn, usage, ["queued_at", "mean_util", "idle_s"])


def _v5(conn: Connection) -> None:
    # From v5 the tracking worker notes ``mlflow_closed`` for each attempt whose MLflow run it
    # closed, and a start closes those over but not noted. Before, runs were closed inside the
    # tick and nothing was noted: note every attempt that is over closed, so that the first
    # start after the upgrade does not close them all again.
    if "ix_events_kind" not in {ix["name"] for ix in inspect(conn).get_indexes("events")}:
        conn.execute(text("CREATE INDEX ix_events_kind ON events (kind)"))
    # (the events as they were then: ``mlflow_legacy``)
    old = mlflow_legacy.unclosed_ids(conn, ACTIVE_PHASES)
    now = time.time()
    done = [
        {"run_id": rid, "time": now, "kind": mlflow_legacy.CLOSED, "phase_from": None,
         "phase_to": None, "attempt": attempt, "reason": text}
        for rid, attempt, text in old
    ]  # fmt: skip
    if done:
        conn.execute(events.insert(), done)


def _v6(conn: Connection) -> None:
    leader.create(conn, checkfirst=True)
    scheduler_status.create(conn, checkfirst=True)


def _v7(conn: Connection) -> None:
    _add_missing_columns(conn, events, ["lost_gpu_s"])


def _v8(conn: Connection) -> None:
    scheduler_cycles.create(conn, checkfirst=True)
    gpu_samples.create(conn, checkfirst=True)
    if "ix_runs_queue" not in {ix["name"] for ix in inspect(conn).get_indexes("runs")}:
        conn.execute(text("CREATE INDEX ix_runs_queue ON runs (phase, project, priority, "
                          "reason_code)"))  # fmt: skip


def _v9(conn: Connection) -> None:
    for t in (users, tokens, memberships, audit):
        t.create(conn, checkfirst=True)


def _v10(conn: Connection) -> None:
    if "ix_runs_finished" not in {ix["name"] for ix in inspect(conn).get_indexes("runs")}:
        conn.execute(text("CREATE INDEX ix_runs_finished ON runs (finished_at)"))


def _v11(conn: Connection) -> None:
    _add_missing_columns(conn, runs, ["held", "array_id"])
    if "ix_runs_array" not in {ix["name"] for ix in inspect(conn).get_indexes("runs")}:
        conn.execute(text("CREATE INDEX ix_runs_array ON runs (array_id)"))


def _v12(conn: Connection) -> None:
    # Attempts' MLflow runs in their own table (``state.mlflow_notes``), no longer in the text
    # of ``mlflow_run``/``mlflow_closed`` events: those of an older store are copied in, in
    # the order its reader saw them, its placeholders (``pending:RUN:ATTEMPT``) as rows
    # without an MLflow run id. The events stay, as the history they are.
    mlflow_runs.create(conn, checkfirst=True)
    rows = [
        {"run_id": n.run_id, "attempt": n.attempt,
         "mlflow_run_id": None if n.text.startswith(mlflow_legacy.PENDING_PREFIX) else n.text,
         "opened_at": n.opened_at, "closed_at": n.closed_at}
        for _, noted in sorted(mlflow_legacy.noted(conn).items())
        for n in noted
    ]  # fmt: skip
    for i in range(0, len(rows), 1000):
        conn.execute(mlflow_runs.insert(), rows[i : i + 1000])


#: Ordered migration steps: (version, step). Version N's step turns schema N-1 into N.
MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [
    (1, _v1), (2, _v2), (3, _v3), (4, _v4), (5, _v5), (6, _v6), (7, _v7), (8, _v8), (9, _v9),
    (10, _v10), (11, _v11), (12, _v12),
]  # fmt: skip
LATEST = MIGRATIONS[-1][0]


def applied(conn: Connection) -> int | None:
    """The version the store is at, read without a write lock (None: no version table yet).
    A store at ``LATEST`` needs no migration, so opening it takes no write lock: a process
    stopped in a write transaction (a scheduler paused mid-tick) then cannot hold up a reader
    such as ``scheduler stop``."""
    if not inspect(conn).has_table(schema_version.name):
        return None
    row = conn.execute(schema_version.select()).first()
    return row.version if row is not None else None


def migrate(conn: Connection) -> int:
    """Apply missing steps; the caller holds the write lock. Returns the version now in place."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(727274)"))
    found = applied(conn)
    current = found or 0
    if current > LATEST:
        raise RuntimeError(
            f"store schema version {current} is newer than this mlops-gpu ({LATEST}); upgrade"
        )
    schema_version.create(conn, checkfirst=True)
    for version, step in MIGRATIONS:
        if version > current:
            step(conn)
    if found is None:
        conn.execute(schema_version.insert().values(version=LATEST))
    elif current != LATEST:
        conn.execute(schema_version.update().values(version=LATEST))
    return LATEST
