"""The store's tables, at their latest definition.

``schema_version`` holds one row with the version applied; the versioned steps that bring an
older store up to these tables are ``state.migrations`` (kept apart so that a step may use the
store's own queries, which import these tables, without an import cycle).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
)

metadata = MetaData()

_Id = BigInteger().with_variant(Integer, "sqlite")

runs = Table(
    "runs",
    metadata,
    # seq orders runs submitted in the same instant and is the row's primary key; id is what
    # users see.
    Column("seq", _Id, primary_key=True, autoincrement=True),
    Column("id", String(32), nullable=False, unique=True),
    Column("name", Text, nullable=False),
    Column("project", String(200), nullable=False),
    Column("user", String(200), nullable=False),
    Column("priority", String(100), nullable=False),
    Column("phase", String(20), nullable=False),
    Column("spec", Text, nullable=False),
    Column("attempt", Integer, nullable=False, default=1),
    Column("submitted_at", Float, nullable=False),
    Column("admitted_at", Float),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("placement", Text),
    Column("gpu_type", String(100)),
    Column("backend", String(100)),
    Column("handle", Text),
    Column("exit_code", Integer),
    Column("reason_code", String(50)),
    Column("reason", Text),
    Column("eta", Float),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("preempt_requested", Boolean, nullable=False, default=False),
    Column("last_checkpoint_at", Float),
    # v2: least-attained-service order and requeue backoff
    Column("attained_gpu_s", Float, nullable=False, default=0.0, server_default="0"),
    Column("not_before", Float),
    # v3: the store revision of the row's last change (``revision``), for change feeds
    Column("rev", _Id, nullable=False, default=0, server_default="0"),
    # v4: when the current attempt joined the queue (submit, or the requeue that made it)
    Column("queued_at", Float),
    Index("ix_runs_phase", "phase"),
    Index("ix_runs_project", "project"),
    Index("ix_runs_rev", "rev"),
    # v8: covers the metrics' count of pending runs by project, class and reason code (an
    # index-only scan instead of reading 50,000 wide rows each scrape)
    Index("ix_runs_queue", "phase", "project", "priority", "reason_code"),
    # v10: ``history`` reads finished runs newest end first from a time on (``state.history``)
    Index("ix_runs_finished", "finished_at"),
    # v11: job control: held by a user (``hold``/``release``), and the array an element is of
    # (``cancel ARRAY_ID``, dependencies on a whole array)
    Column("held", Boolean, nullable=False, default=False, server_default=false()),
    Column("array_id", String(32)),
    Index("ix_runs_array", "array_id"),
)

#: One row: the store's revision, raised by every transaction that changes a run (not by
#: reason-only writes). Raising it takes the row's lock until commit, so revisions commit in
#: order: a reader that has seen revision r has seen every change up to r.
revision = Table(
    "revision",
    metadata,
    Column("value", BigInteger, nullable=False),
)

events = Table(
    "events",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False),
    Column("time", Float, nullable=False),
    Column("kind", String(30), nullable=False),
    Column("phase_from", String(20)),
    Column("phase_to", String(20)),
    Column("attempt", Integer, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Index("ix_events_run", "run_id"),
    Index("ix_events_kind", "kind"),  # v5: a start reads the MLflow notes by kind
    # v7: GPU-seconds of work a ``preempting`` event throws away (since the victim's last
    # checkpoint, else since it started); null on every other event
    Column("lost_gpu_s", Float),
)

usage = Table(
    "usage",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("project", String(200), nullable=False),
    Column("user", String(200), nullable=False),
    Column("gpu_type", String(100), nullable=False),
    Column("backend", String(100), nullable=False),
    Column("gpus", Float, nullable=False),
    Column("start", Float, nullable=False),
    Column("end", Float, nullable=False),
    Column("gpu_seconds", Float, nullable=False),
    Column("outcome", String(20), nullable=False),
    # v4: queue wait, mean GPU utilization (percent, when the launcher sampled a device) and
    # the seconds the attempt's GPUs sat idle past the idle window (wasted GPU time)
    Column("queued_at", Float),
    Column("mean_util", Float),
    Column("idle_s", Float, nullable=False, default=0.0, server_default="0"),
    Index("ix_usage_project", "project"),
    Index("ix_usage_run", "run_id"),
)

#: v12: the MLflow runs of each attempt (``state.mlflow_notes``), one row per MLflow run a launch
#: of the attempt made or adopted, in the order noted (``id``; the attempt's last row is its
#: live launch's). ``mlflow_run_id`` null: a launch that did not wait for MLflow, its run not
#: made yet; set once it is. ``closed_at``: when MLflow took the close (metrics and status).
mlflow_runs = Table(
    "mlflow_runs",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("mlflow_run_id", String(200)),
    Column("opened_at", Float, nullable=False),
    Column("closed_at", Float),
    Index("ix_mlflow_runs_run", "run_id", "attempt"),
    # a start reads the rows not closed
    Index("ix_mlflow_runs_closed", "closed_at"),
)

#: v6: the scheduler's lease (``lease.py``): one row, leadership and its fencing epoch.
leader = Table(
    "leader",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("holder", String(300), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("host", String(255), nullable=False),
)

#: v6 too: what the running scheduler publishes about itself (one row, ``id`` 1): see
#: ``state.heartbeat``. Kept apart from the leader lock: it says who runs, never decides it.
scheduler_status = Table(
    "scheduler_status",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("pid", Integer, nullable=False),
    Column("host", String(255), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("beat_at", Float, nullable=False),
    Column("tick_at", Float),
    Column("ticks", _Id, nullable=False, default=0),
    Column("engine", String(20)),
    Column("idle_exit_s", Float),
    Column("config_path", Text),
    Column("config_hash", String(64)),
    Column("config_mtime", Float),
    Column("config_loaded_at", Float),
    Column("config_error", Text),
    #: restart-only sections (comma-separated) the loaded file changed: applied at a restart
    Column("config_restart", Text),
    Column("version", String(50)),
    Column("stopped_at", Float),
)

#: v8: the scheduler's own cycle-latency histogram (one row, ``id`` 1), rewritten with its
#: heartbeat (``state.observed``) for metrics scrapes in other processes: cumulative over the
#: publishing scheduler's life (``pid``); a new scheduler starts it again from zero.
scheduler_cycles = Table(
    "scheduler_cycles",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("pid", Integer, nullable=False),
    Column("count", _Id, nullable=False),
    Column("sum_s", Float, nullable=False),
    #: JSON list of cumulative counts, one per bucket of ``observed.CYCLE_BUCKETS``
    Column("buckets", Text, nullable=False),
    Column("at", Float, nullable=False),
)

#: v8 too: the last GPU sample of each device a running run holds (``state.observed``),
#: written by the scheduler from its launchers' telemetry files; a device no running run
#: reports on has no row.
gpu_samples = Table(
    "gpu_samples",
    metadata,
    Column("node", String(255), primary_key=True),
    Column("device", String(255), primary_key=True),
    Column("run_id", String(32), nullable=False),
    Column("utilization_pct", Float),
    Column("memory_used_mb", Float),
    Column("at", Float, nullable=False),
)

#: v9: the identities of ``mlops-gpu server`` (``state.users``): one row per user name.
users = Table(
    "users",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("admin", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
)

#: v9: API tokens, stored as the SHA-256 of the token (the token itself is shown once).
tokens = Table(
    "tokens",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("hash", String(64), nullable=False, unique=True),
    Column("user", String(200), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("revoked_at", Float),
    Index("ix_tokens_user", "user"),
)

#: v9: project roles set by admins (the config's ``projects.NAME.members`` add to these).
memberships = Table(
    "memberships",
    metadata,
    Column("user", String(200), primary_key=True),
    Column("project", String(200), primary_key=True),
    Column("role", String(20), nullable=False),
)

#: v9: every mutating request of the server (``state.audit``), append-only.
audit = Table(
    "audit",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("user", String(200)),
    Column("action", String(200), nullable=False),
    Column("target", String(300)),
    Column("client", String(100)),
    Column("status", Integer, nullable=False),
    Column("detail", Text),
    Index("ix_audit_time", "time"),
    Index("ix_audit_user", "user"),
)

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, nullable=False),
)
