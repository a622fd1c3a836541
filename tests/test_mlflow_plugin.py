"""The ``mlflow.run_context_provider`` plugin: a run a job starts itself with ``mlflow`` is
tagged with the scheduled run and attempt; outside a scheduled job nothing is added."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import json, mlflow
with mlflow.start_run() as r:
    pass
tags = mlflow.get_run(r.info.run_id).data.tags
print(json.dumps({k: v for k, v in tags.items() if k.startswith("mlops_gpu")}))
"""


def tags_of_a_run_started(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("MLOPS_GPU_", "MLFLOW_"))}
    full.update(env, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    proc = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", SCRIPT],
        env=full, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_a_run_started_inside_a_scheduled_job_is_tagged(tmp_path: Path) -> None:
    env = {"MLOPS_GPU_RUN_ID": "r0123456789", "MLOPS_GPU_ATTEMPT": "2"}
    assert tags_of_a_run_started(tmp_path, env) == {
        "mlops_gpu.run_id": "r0123456789",
        "mlops_gpu.attempt": "2",
    }


@pytest.mark.slow
def test_outside_a_job_nothing_is_added(tmp_path: Path) -> None:
    assert tags_of_a_run_started(tmp_path, {}) == {}
