"""Shared fixtures: a config folder on the local backend, a PostgreSQL URL from the repo's own
script, the CLI as a subprocess, the Rust engine's module (or the Python engine in its place),
and the throughput benchmark at a small scale."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mlops_gpu.state.store import Store
from mlops_gpu.testing import config_yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def native_module() -> ModuleType:
    """The Rust engine, ``mlops_gpu._engine``, as ``pip install -e .`` built it where cargo
    was on PATH. Missing, the test skips, unless ``MLOPS_GPU_REQUIRE_NATIVE`` is set (CI): it
    fails."""
    from mlops_gpu.engines import native

    module = native.installed()
    if module is None:
        msg = "mlops_gpu._engine is not built (no cargo at `pip install -e .`)"
        if os.environ.get("MLOPS_GPU_REQUIRE_NATIVE"):
            pytest.fail(msg)
        pytest.skip(msg)
    return module


@pytest.fixture
def without_native(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if the install had built no Rust engine: the Python engine serves."""
    from mlops_gpu.engines import native

    monkeypatch.setattr(native, "_engine", None)


def core_bench(*args: str) -> dict[str, Any]:
    """``benchmarks/core_throughput.py`` at 20 nodes x 1,000 runs: its JSON line."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "core_throughput.py"),
         "--nodes", "20", "--runs", "1000", *args],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    """A config with one local node of 4 virtual a100-80gb and project ``p`` (nominal 4)."""
    p = tmp_path / "mlops-gpu.yaml"
    p.write_text(config_yaml())
    return p


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "mlops_gpu.cli.main", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_service(
    script: str, what: str, require_env: str, timeout: float, key: str | None = None
) -> str:
    """Start a real service with the repo's ``scripts/<script> start`` (idempotent: one already
    up, as ``.ci/run`` leaves it, is reused) and return what it prints last: the value of its
    last ``KEY=value`` line, or without ``key`` its last line. Where it cannot start, the test
    skips, unless ``require_env`` is set (CI), where it fails: a skip would hide the breakage."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / script), "start"],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    if key is not None:
        lines = [x.split("=", 1)[1] for x in lines if x.startswith(f"{key}=")]
    if proc.returncode != 0 or not lines:
        msg = f"scripts/{script} could not start {what}: {(proc.stderr or proc.stdout)[-800:]}"
        if os.environ.get(require_env):
            pytest.fail(msg)
        pytest.skip(msg)
    return lines[-1]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL (Debian's) started by scripts/postgres.sh; skips where it can't run.

    ``MLOPS_GPU_TEST_PG_URL`` overrides (a server someone else runs).
    """
    url = os.environ.get("MLOPS_GPU_TEST_PG_URL")
    if not url:
        if shutil.which("bash") is None:
            pytest.skip("no bash to run scripts/postgres.sh")
        url = start_service("postgres.sh", "PostgreSQL", "MLOPS_GPU_REQUIRE_POSTGRES", 600)
    yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store's URL, once on SQLite and once on a real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/s.db"
    return str(request.getfixturevalue("pg_store_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A fresh store on ``store_url`` (SQLite, then a real PostgreSQL), closed after the test."""
    s = Store(store_url)
    yield s
    s.close()


@pytest.fixture
def pg_store_url(postgres_url: str) -> Iterator[str]:
    """The PostgreSQL URL with the mlops-gpu tables dropped before the test (a clean store)."""
    from sqlalchemy import create_engine, text

    eng = create_engine(postgres_url)
    with eng.begin() as conn:
        for t in ("runs", "events", "usage", "schema_version", "leader", "scheduler_status",
                  "scheduler_cycles", "gpu_samples", "mlflow_runs",
                  "users", "tokens", "memberships", "audit"):  # fmt: skip
            conn.execute(text(f"DROP TABLE IF EXISTS {t} CASCADE"))
    eng.dispose()
    yield postgres_url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` (SQLite store, one worker) on a free port, for the session."""
    d = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    log = open(d / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{d}/mlflow.db",
         "--default-artifact-root", str(d / "artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError((d / "server.log").read_text()[-2000:]) from None
                time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def stop_scheduler(cfg: Path) -> None:
    """The scheduler the SDK started for this config, stopped (the store's lease names its
    pid)."""
    import contextlib
    import signal

    from mlops_gpu.config import load_config
    from mlops_gpu.state import Store
    from mlops_gpu.state.lock import current_holder

    store = Store(load_config(cfg).store_url)
    try:
        holder = current_holder(store)
    finally:
        store.close()
    if holder is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder.pid, signal.SIGTERM)


def stored(cfg: Path) -> int:
    """How many runs the store of config ``cfg`` holds (nothing stored on a refusal)."""
    from mlops_gpu.config import load_config
    from mlops_gpu.state import Store

    store = Store(load_config(cfg).store_url)
    try:
        return store.count()
    finally:
        store.close()
