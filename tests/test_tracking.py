"""MLflow runs for scheduled runs, against a real ``mlflow server``: one per attempt with the
tags, queue wait, GPU-hours and cost; the job's environment points at it; a preempted attempt is
KILLED and its successor gets its own MLflow run linked by ``mlops_gpu.run_id``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.controller.usage_report import build_report
from mlops_gpu.model import GpuType, ResourceRequest
from mlops_gpu.testing import config_yaml
from mlops_gpu.tracking.tracker import Tracker

pytestmark = pytest.mark.mlflow_server


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # submits are stamped with the wall clock

    def __call__(self) -> float:
        return self.now


def runtime(
    tmp_path: Path, server: str, clock: Clock, *, enabled: bool = True, store: str | None = None
) -> Runtime:
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)], projects={"vision": (4, 0)}))
    if store is not None:  # (a state store of the test's: ``store_url``)
        data["store"] = store
    data["backends"] = {"fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    data["mlflow"] = {"tracking_uri": server, "enabled": enabled}
    rt = Runtime(parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path))
    rt.__dict__["backends"] = {"fake": FakeBackend("fake", rt.cfg.model_nodes("fake"), clock=clock)}
    return rt


def mlflow_runs(server: str, run_id: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server)
    exps = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(exps, f"tags.`mlops_gpu.run_id` = '{run_id}'")
    return sorted(found, key=lambda r: int(r.data.tags["mlops_gpu.attempt"]))


def test_each_attempt_is_an_mlflow_run_with_tags_wait_hours_and_cost(
    tmp_path: Path, mlflow_server: str
) -> None:
    clock = Clock()
    rt = runtime(tmp_path, mlflow_server, clock)
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    run = rt.submit(
        rt.spec(("train",), project="vision", request=ResourceRequest(gpus=2),
                experiment="resnet", env={"FAKE_DURATION_S": "1800"})
    )  # fmt: skip
    ctl = Controller(rt, clock=clock)
    clock.now += 30  # it waited 30 s in the queue
    ctl.tick()
    (job,) = fake.jobs.values()
    env = job.req.env
    assert env["MLFLOW_TRACKING_URI"] == mlflow_server and env["MLFLOW_RUN_ID"]
    clock.now += 1800  # it runs its 30 minutes
    ctl.tick()
    assert ctl.drain_tracking()  # closes are made off the tick's path
    (mr,) = mlflow_runs(mlflow_server, run.id)
    assert mr.info.run_id == env["MLFLOW_RUN_ID"] and mr.info.status == "FINISHED"
    tags = mr.data.tags
    assert (tags["mlops_gpu.project"], tags["mlops_gpu.gpu_type"]) == ("vision", "a100-80gb")
    assert (tags["mlops_gpu.attempt"], tags["mlops_gpu.backend"]) == ("1", "fake")
    assert (tags["mlops_gpu.nodes"], tags["mlops_gpu.gpu_uuids"]) == ("node-a", "0,1")
    assert tags["mlops_gpu.outcome"] == "succeeded" and tags["mlops_gpu.user"]
    m = mr.data.metrics
    assert m["mlops_gpu.queue_wait_s"] == pytest.approx(30.0, abs=1.0)
    assert m["mlops_gpu.gpu_hours"] == pytest.approx(2 * 0.5)
    assert m["mlops_gpu.cost_usd"] == pytest.approx(2 * 0.5 * 2.5)  # $2.5 per GPU-hour


def test_a_preempted_attempt_is_killed_and_the_next_gets_its_own_run(
    tmp_path: Path, mlflow_server: str, store_url: str
) -> None:
    clock = Clock()
    rt = runtime(tmp_path, mlflow_server, clock, store=store_url)
    run = rt.submit(
        rt.spec(("train",), project="vision", request=ResourceRequest(gpus=4),
                env={"FAKE_DURATION_S": "3600"})
    )  # fmt: skip
    ctl = Controller(rt, clock=clock)
    ctl.tick()
    rt.store.mark_preempting(run.id, "make room", now=clock.now)
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    (handle,) = fake.jobs
    fake.cancel(handle, "SIGTERM", 0.0)  # the checkpoint signal stops it
    clock.now += 5
    ctl.tick()  # sees it preempted: requeued with a backoff
    clock.now += 60
    ctl.tick()  # attempt 2
    assert ctl.drain_tracking()
    first, second = mlflow_runs(mlflow_server, run.id)
    assert first.info.status == "KILLED" and first.data.tags["mlops_gpu.outcome"] == "preempted"
    assert second.info.status == "RUNNING" and second.data.tags["mlops_gpu.attempt"] == "2"
    assert first.info.experiment_id == second.info.experiment_id  # the project's experiment
    links = [(m.attempt, m.mlflow_run_id, m.closed_at is not None)
             for m in rt.store.mlflow_links(run.id)]  # fmt: skip
    assert links == [(1, first.info.run_id, True), (2, second.info.run_id, False)]
    from mlops_gpu.sdk.run import Run as SdkRun

    assert SdkRun(run.id, rt).mlflow_run_id == second.info.run_id  # the current attempt's

    clock.now += 3600  # attempt 2 runs its hour
    ctl.tick()
    assert ctl.drain_tracking()
    runs = mlflow_runs(mlflow_server, run.id)
    assert runs[1].info.status == "FINISHED"
    # the report's total is the MLflow runs' cost, to the cent
    prices = {t: g.price_per_hour for t, g in rt.cfg.model_gpu_types().items()}
    report = build_report(rt.store.usage(), prices, None)
    logged = sum(r.data.metrics["mlops_gpu.cost_usd"] for r in runs)
    assert round(report["total"]["cost_usd"], 2) == round(logged, 2) > 0
    (row,) = report["rows"]
    assert (row["key"], row["runs"], row["attempts"], row["preemptions"]) == ("vision", 1, 2, 1)
    assert row["gpu_hours"] == report["total"]["gpu_hours"]
    # each attempt's wait is the same in MLflow and in the report
    waits = sorted(r.data.metrics["mlops_gpu.queue_wait_s"] for r in runs)
    assert row["mean_wait_s"] == pytest.approx(sum(waits) / 2, abs=0.05)  # (MLflow's: 0.1 s)


def test_the_default_local_store_is_tracked_through_the_mlflow_package(
    tmp_path: Path, store_url: str
) -> None:
    """MLflow's SQLite store (the embedded default): the same runs, tags and metrics, written by
    the scheduler; the launcher's mean utilization comes through the scheduler."""
    from mlflow.tracking import MlflowClient

    from mlops_gpu.backends import JobTelemetry

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    clock = Clock()
    rt = runtime(tmp_path, uri, clock, store=store_url)
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={"FAKE_DURATION_S": "600"}))  # fmt: skip
    ctl = Controller(rt, clock=clock)
    ctl.warm()  # the store is opened beside the ticks (as the daemon's start does)
    assert ctl.tracker.wait_ready(120)
    ctl.tick()
    (job,) = fake.jobs.values()
    assert job.req.env["MLFLOW_TRACKING_URI"] == uri and job.req.env["MLFLOW_RUN_ID"]
    from mlops_gpu.sdk.run import Run as SdkRun

    assert SdkRun(run.id, rt).mlflow_run_id == job.req.env["MLFLOW_RUN_ID"]
    job.telemetry = JobTelemetry(mean_utilization=42.0, idle_s=60.0)
    clock.now += 600
    ctl.tick()
    assert ctl.drain_tracking()
    (mr,) = mlflow_runs(uri, run.id)
    assert mr.info.run_id == job.req.env["MLFLOW_RUN_ID"] and mr.info.status == "FINISHED"
    assert mr.data.tags["mlops_gpu.project"] == "vision"
    m = mr.data.metrics
    assert m["mlops_gpu.gpu_hours"] == round(600 / 3600, 4)  # (rounded: tracking.fields)
    assert m["mlops_gpu.mean_gpu_utilization"] == 42.0
    (row,) = rt.store.usage()
    assert (row.mean_util, row.idle_s) == (42.0, 60.0)
    assert MlflowClient(uri).get_experiment_by_name("vision") is not None


def test_mlflow_disabled_creates_no_runs_and_no_store(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    clock = Clock()
    rt = runtime(tmp_path, uri, clock, enabled=False)
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                      env={"FAKE_DURATION_S": "60"}))  # fmt: skip
    ctl = Controller(rt, clock=clock)
    ctl.tick()
    (job,) = fake.jobs.values()
    assert "MLFLOW_RUN_ID" not in job.req.env and "MLFLOW_TRACKING_URI" not in job.req.env
    clock.now += 60
    ctl.tick()
    assert {r.phase.value for r in rt.store.list_runs()} == {"succeeded"}
    assert not (tmp_path / "mlflow.db").exists()


def test_an_unusable_local_store_pauses_tracking_and_runs_go_on(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where the store's folder should be")
    uri = f"sqlite:///{tmp_path}/file/mlflow.db"
    t = Tracker(uri, {"a": GpuType("a")})
    clock = Clock()
    rt = runtime(tmp_path, uri, clock)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1)))
    ctl = Controller(rt, clock=clock)
    ctl.tick()
    got = rt.store.get(run.id)
    assert got is not None and got.phase.value in ("starting", "running")
    assert not ctl.tracker.active and t.active  # paused after the failure; a fresh one is not


def test_a_server_that_fails_pauses_tracking_and_runs_go_on(tmp_path: Path) -> None:
    clock = Clock()
    rt = runtime(tmp_path, "http://127.0.0.1:9", clock)  # nothing listens there
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1)))
    ctl = Controller(rt, clock=clock)
    ctl.tick()
    got = rt.store.get(run.id)
    assert got is not None and got.phase.value in ("starting", "running")
    assert not ctl.tracker.active  # paused after the failure
