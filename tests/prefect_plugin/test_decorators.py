"""``@gpu_task`` inside a flow (run against the session's real Prefect server): each task holds
its GPUs for its body under the project's quota; ``@gpu_flow`` binds a flow's deployments to an
``mlops-gpu`` pool."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import stop_scheduler

from .conftest import mlops_config

pytestmark = [pytest.mark.slow, pytest.mark.prefect_server]


def test_gpu_tasks_hold_their_gpus_under_the_quota(harness: None, tmp_path: Path) -> None:
    from mlops_gpu_prefect import gpu_task
    from prefect import flow

    import mlops_gpu as mg

    cfg = mlops_config(tmp_path, {"p": (2, 0)})

    @gpu_task(gpus=2, project="p", config=str(cfg), timeout=120)
    def train(i: int) -> tuple[float, float, Any]:
        t0 = time.monotonic()
        time.sleep(1.0)
        return t0, time.monotonic(), mg.current_gpus()

    @flow
    def two_trainings() -> list[Any]:
        futures = [train.submit(i) for i in range(2)]
        return [f.result() for f in futures]

    try:
        (a0, a1, da), (b0, b1, db) = sorted(two_trainings())
    finally:
        stop_scheduler(cfg)
    assert a1 <= b0 or b1 <= a0  # one at a time: 2 GPUs each against a quota of 2
    assert len(da) == len(db) == 2


def test_gpu_flow_binds_deployments_to_the_pool() -> None:
    from mlops_gpu_prefect import gpu_flow
    from prefect import flow

    @gpu_flow(work_pool="gpus", project="vision", gpus=2, gpu_type="a100-80gb")
    @flow
    def train() -> None:
        return None

    d = train.to_deployment(name="t", job_variables={"gpus": 4})
    assert d.work_pool_name == "gpus"
    assert d.job_variables == {"project": "vision", "gpus": 4, "gpu_type": "a100-80gb"}
    with pytest.raises(TypeError, match="unknown job variable"):
        gpu_flow(work_pool="gpus", project="v", gpu=2)
