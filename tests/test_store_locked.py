"""A SQLite store another process holds the write lock of (a scheduler paused mid-tick).

Opening a store at the latest schema takes no write lock, so reads (``scheduler stop``'s
heartbeat, ``queue``) go on beside a held one; a write that waits past the busy timeout ends in
one ``mlops-gpu: error:`` line naming the store, never a traceback.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import click
import sqlalchemy.exc
from click.testing import CliRunner
from conftest import run_cli

from mlops_gpu.cli.errors import SetupErrorsAsOneLine
from mlops_gpu.config import load_config
from mlops_gpu.state import Store
from mlops_gpu.testing import config_yaml

QUIET = {"mlflow": {"enabled": False}}


def test_commands_that_only_read_do_not_wait_for_a_held_write_lock(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(extra=QUIET))
    url = load_config(cfg).store_url
    Store(url).close()  # the store exists, at the latest schema
    path = url.removeprefix("sqlite:///")
    holder = sqlite3.connect(path, timeout=1, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # as a scheduler stopped inside a write would
    try:
        t0 = time.monotonic()
        stop = run_cli("--config", str(cfg), "scheduler", "stop", "--timeout", "1")
        queue = run_cli("--config", str(cfg), "queue", "--json")
        took = time.monotonic() - t0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert stop.returncode == 0, stop.stderr
    assert "no scheduler is running" in stop.stdout
    assert queue.returncode == 0, queue.stderr
    # without the fix each waited for the 120 s busy timeout; two CLI starts take seconds
    assert took < 60


def test_a_lock_held_past_the_busy_timeout_is_one_line_naming_the_store(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(extra=QUIET))

    @click.group(cls=SetupErrorsAsOneLine)
    @click.pass_context
    def cli(ctx: click.Context) -> None:
        ctx.obj = {"config": str(cfg)}

    @cli.command()
    def write() -> None:
        raise sqlalchemy.exc.OperationalError(
            "BEGIN IMMEDIATE", {}, sqlite3.OperationalError("database is locked")
        )

    @cli.command()
    def other() -> None:
        raise sqlalchemy.exc.OperationalError(
            "SELECT", {}, sqlite3.OperationalError("no such table: x")
        )

    out = CliRunner().invoke(cli, ["write"])
    assert out.exit_code == 1
    store = load_config(cfg).store_url.removeprefix("sqlite:///")
    assert out.output.splitlines() == [
        f"mlops-gpu: error: {store} stayed locked by another process for 120s (a scheduler "
        "paused or stuck in a write? see `mlops-gpu scheduler status`); retry when it is free"
    ]
    # any other database error is not dressed up as a lock: it propagates as it was
    passed = CliRunner().invoke(cli, ["other"])
    assert isinstance(passed.exception, sqlalchemy.exc.OperationalError)
