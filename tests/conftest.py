"""Shared fixtures: a config folder on the local backend, a PostgreSQL URL from the repo's own
script, and the CLI as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlops_gpu.testing import config_yaml

REPO = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL (Debian's) started by scripts/postgres.sh; skips where it can't run.

    ``MLOPS_GPU_TEST_PG_URL`` overrides (a server someone else runs).
    """
    url = os.environ.get("MLOPS_GPU_TEST_PG_URL")
    if not url:
        if shutil.which("bash") is None:
            pytest.skip("no bash to run scripts/postgres.sh")
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "postgres.sh"), "start"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            msg = f"scripts/postgres.sh could not start PostgreSQL: {proc.stderr[-500:]}"
            if os.environ.get("MLOPS_GPU_REQUIRE_POSTGRES"):  # CI: a skip would hide this
                pytest.fail(msg)
            pytest.skip(msg)
        url = proc.stdout.strip().splitlines()[-1]
    yield url


@pytest.fixture
def pg_store_url(postgres_url: str) -> Iterator[str]:
    """The PostgreSQL URL with the mlops-gpu tables dropped before the test (a clean store)."""
    from sqlalchemy import create_engine, text

    eng = create_engine(postgres_url)
    with eng.begin() as conn:
        for t in ("runs", "events", "usage", "schema_version"):
            conn.execute(text(f"DROP TABLE IF EXISTS {t} CASCADE"))
    eng.dispose()
    yield postgres_url
