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


def test_eight_concurrent_gpu_tasks_each_see_exactly_their_lease(
    harness: None, tmp_path: Path
) -> None:
    """Eight ``.submit()`` calls at once on 8 GPUs: each task's ``CUDA_VISIBLE_DEVICES`` is its
    own lease's device (disjoint from the others'); finished leases end ``succeeded``, the one
    whose task raised ``failed`` (in the store and in MLflow), none as a cancel."""
    import os

    from mlflow.tracking import MlflowClient
    from mlops_gpu_prefect import gpu_task
    from prefect import flow

    import mlops_gpu as mg
    from mlops_gpu.controller import Runtime

    cfg = mlops_config(tmp_path, {"p": (8, 0)}, backends={"local": {"type": "local",
                       "nodes": [{"name": "n", "gpu_type": "a100-80gb", "gpus": 8}]}})  # fmt: skip

    @gpu_task(gpus=1, project="p", config=str(cfg), timeout=120)
    def probe(i: int) -> tuple[int, str | None, Any, float, float]:
        t0 = time.time()
        time.sleep(3.0)  # long enough for all eight to hold their leases at once
        return i, os.environ.get("CUDA_VISIBLE_DEVICES"), mg.current_gpus(), t0, time.time()

    @gpu_task(gpus=1, project="p", config=str(cfg), timeout=120)
    def broken() -> None:
        raise ValueError("the task failed")

    @flow
    def eight() -> list[Any]:
        futures = [probe.submit(i) for i in range(8)]
        return [f.result() for f in futures]

    @flow
    def one_fails() -> None:
        broken()

    rt = Runtime.load(cfg)
    try:
        seen = eight()
        with pytest.raises(ValueError, match="the task failed"):
            one_fails()
        leases = [r for r in rt.store.list_runs() if r.spec.name == "task:probe"]
        (bad,) = [r for r in rt.store.list_runs() if r.spec.name == "task:broken"]
        client = MlflowClient(rt.cfg.tracking_uri(dict(os.environ)))
        status: dict[str, tuple[str, str | None]] = {}
        deadline = time.time() + 60
        while time.time() < deadline:  # tracking closes runs beside the scheduler's tick
            exps = [e.experiment_id for e in client.search_experiments()]
            status = {mr.data.tags["mlops_gpu.run_id"]: (mr.info.status,
                                                        mr.data.tags.get("mlops_gpu.outcome"))
                      for mr in client.search_runs(exps)}  # fmt: skip
            if all(status.get(r.id, ("RUNNING",))[0] != "RUNNING" for r in [*leases, bad]):
                break
            time.sleep(0.5)
    finally:
        stop_scheduler(cfg)
    visible = [v for _, v, _, _, _ in seen]
    assert all(v is not None and len(v.split(",")) == 1 for v in visible), visible
    assert len(set(visible)) == 8  # disjoint
    assert all(tuple(str(v).split(",")) == cur for _, v, cur, _, _ in seen)
    assert max(t0 for *_, t0, _ in seen) < min(t1 for *_, t1 in seen)  # all eight at once
    assert len(leases) == 8 and all(r.phase.value == "succeeded" for r in leases)
    placed = {",".join(d for s in r.placement.slots for d in s.devices)
              for r in leases if r.placement}  # fmt: skip
    assert placed == set(visible)  # each task saw a lease's devices, no two the same lease's
    assert bad.phase.value == "failed"
    assert {status[r.id] for r in leases} == {("FINISHED", "succeeded")}
    assert status[bad.id] == ("FAILED", "failed")
