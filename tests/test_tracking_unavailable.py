"""Tracking runs beside scheduling: an MLflow store that cannot be opened holds no tick (MLflow's
own retries would take ~100 s) and no stop (a real scheduler exits within 2 s of SIGTERM); one
run that MLflow refuses does not stop the tracking of others; runs launched while MLflow was
away get their MLflow runs, closed, once it is back. The local SQLite store, the real package."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import ResourceRequest
from mlops_gpu.state.store import Store
from mlops_gpu.testing import config_yaml
from mlops_gpu.tracking import tracker as tracking


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def runtime(tmp_path: Path, uri: str, clock: Clock, store_url: str | None = None) -> Runtime:
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)], projects={"vision": (4, 0)}))
    if store_url is not None:
        data["store"] = store_url
    data["backends"] = {"fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    data["mlflow"] = {"tracking_uri": uri}
    rt = Runtime(parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path))
    rt.__dict__["backends"] = {"fake": FakeBackend("fake", rt.cfg.model_nodes("fake"), clock=clock)}
    return rt


def mlflow_runs(uri: str, run_id: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, f"tags.`mlops_gpu.run_id` = '{run_id}'")


@pytest.mark.parametrize("bad", ["folder", "garbage"])
@pytest.mark.timeout(90)
def test_a_store_that_cannot_be_opened_holds_no_tick(
    tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "mlflow.db"
    if bad == "folder":
        db.mkdir()
    else:
        db.write_bytes(b"not a database at all\n" * 100)
    clock = Clock()
    rt = runtime(tmp_path, f"sqlite:///{db}", clock)
    ids = [rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1))).id
           for _ in range(3)]  # fmt: skip
    ctl = Controller(rt, clock=clock)
    t0 = time.monotonic()
    ctl.tick()
    assert time.monotonic() - t0 < 3  # (MLflow itself retries opening it for ~100 s)
    assert {rt.store.get(i).phase.value for i in ids} <= {"starting", "running"}  # type: ignore[union-attr]
    # (the MLflow thread opens the store and says so: on a loaded machine after the tick)
    deadline = time.monotonic() + 30
    while True:
        said = [r.getMessage() for r in caplog.records if r.name == "mlops_gpu.tracking"]
        if any(str(db) in m for m in said) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert any(str(db) in m and "move it away" in m for m in said), said  # one line: what to do
    t0 = time.monotonic()
    ctl.release()
    assert time.monotonic() - t0 < 1


@pytest.mark.timeout(120)
def test_sigterm_stops_a_scheduler_within_2s_while_mlflow_is_broken(tmp_path: Path) -> None:
    (tmp_path / "state" / "mlflow.db").mkdir(parents=True)  # the default store's path
    cfg = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml(projects={"vision": (4, 0)}))
    data["scheduler"] = {"tick_s": 0.2}
    cfg.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLOPS_GPU_", "MLFLOW_"))}
    cli = [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(cfg)]
    for _ in range(2):
        subprocess.run([*cli, "submit", "--no-start", "-p", "vision", "--", "sleep", "60"],
                       env=env, check=True, capture_output=True)  # fmt: skip
    proc = subprocess.Popen([*cli, "scheduler"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        store = Store(f"sqlite:///{tmp_path / 'state.db'}")
        deadline = time.monotonic() + 60
        while {r.phase.value for r in store.list_runs()} != {"running"}:
            assert time.monotonic() < deadline, "the runs did not start: a tick is held"
            time.sleep(0.1)
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert took < 2.0, err[-2000:]
    assert "is a folder, not a SQLite file" in err
    assert "Operation will be retried" not in err  # (MLflow's own retry loop never ran)


@pytest.mark.timeout(300)
def test_a_run_mlflow_refuses_does_not_stop_tracking_of_others(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    clock = Clock()
    rt = runtime(tmp_path, uri, clock)
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    # adopts an MLflow run this store does not have (made in another store)
    odd = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={tracking.ADOPT_ENV: "0123456789abcdef0123456789abcdef",
                                 "FAKE_DURATION_S": "60"}))  # fmt: skip
    ctl = Controller(rt, clock=clock)
    ctl.warm()  # the store opened beside, as a daemon's start does
    assert getattr(ctl.tracker, "wait_ready", lambda _: True)(120)
    ctl.tick()
    plain = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                              env={"FAKE_DURATION_S": "60"}))  # fmt: skip
    ctl.tick()
    envs = {j.req.run_id: j.req.env for j in fake.jobs.values()}
    assert envs[plain.id].get("MLFLOW_RUN_ID")  # tracking did not pause for everyone
    assert envs[odd.id].get("MLFLOW_RUN_ID")  # and the refused one got a run of its own
    assert ctl.tracker.active
    clock.now += 60
    ctl.tick()
    assert ctl.drain_tracking(60)
    for r in (odd, plain):
        (mr,) = mlflow_runs(uri, r.id)
        assert mr.info.status == "FINISHED"


@pytest.mark.timeout(300)
def test_runs_launched_while_mlflow_was_away_are_tracked_once_it_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    """On a SQLite and a PostgreSQL state store: the launch notes its MLflow run without an id,
    filled once the run is made (``mlflow_runs``)."""
    monkeypatch.setattr(tracking, "BACKOFF_S", 0.2, raising=False)
    db = tmp_path / "mlflow.db"
    db.mkdir()  # away at the launch
    uri = f"sqlite:///{db}"
    clock = Clock()
    rt = runtime(tmp_path, uri, clock, store_url)
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=2),
                            env={"FAKE_DURATION_S": "900"}))  # fmt: skip
    ctl = Controller(rt, clock=clock)
    clock.now += 20  # 20 s in the queue
    ctl.tick()
    (job,) = fake.jobs.values()
    assert "MLFLOW_RUN_ID" not in job.req.env
    db.rmdir()  # back
    clock.now += 900
    ctl.tick()  # it ends: its close is queued, and made (with its MLflow run) once MLflow is back
    assert ctl.drain_tracking(120)
    (mr,) = mlflow_runs(uri, run.id)
    assert mr.info.status == "FINISHED" and mr.data.tags["mlops_gpu.outcome"] == "succeeded"
    assert mr.data.metrics["mlops_gpu.gpu_hours"] == 0.5
    assert mr.data.metrics["mlops_gpu.queue_wait_s"] == pytest.approx(20, abs=1)
    assert mr.info.start_time == int(rt.store.get(run.id).admitted_at * 1000)  # type: ignore[union-attr]
    (noted,) = rt.store.mlflow_links(run.id)
    assert (noted.mlflow_run_id, noted.closed_at is not None) == (mr.info.run_id, True)


@pytest.mark.timeout(300)
def test_a_run_launched_while_mlflow_was_away_is_tracked_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_url: str
) -> None:
    """On a SQLite and a PostgreSQL state store: the launch notes its MLflow run without an id,
    filled once the run is made (``mlflow_runs``)."""
    monkeypatch.setattr(tracking, "BACKOFF_S", 0.2, raising=False)
    db = tmp_path / "mlflow.db"
    db.mkdir()  # away at the launch, and when the attempt ends
    uri = f"sqlite:///{db}"
    clock = Clock()
    rt = runtime(tmp_path, uri, clock, store_url)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={"FAKE_DURATION_S": "1800"}))  # fmt: skip
    ctl = Controller(rt, clock=clock)
    ctl.tick()
    clock.now += 1800
    ctl.tick()
    ctl.release()  # stopped with the close not made: MLflow was away all along
    db.rmdir()  # back
    again = Controller(rt, clock=clock)
    again.reconcile()  # the start's recovery makes the MLflow run and closes it
    assert again.drain_tracking(120)
    (mr,) = mlflow_runs(uri, run.id)
    assert mr.info.status == "FINISHED" and mr.data.tags["mlops_gpu.outcome"] == "succeeded"
    assert mr.data.metrics["mlops_gpu.gpu_hours"] == 0.5
    assert mr.data.tags["mlflow.user"] == run.spec.user
    (noted,) = rt.store.mlflow_links(run.id)  # the row its launch noted without an id, filled
    assert noted.mlflow_run_id == mr.info.run_id and noted.closed_at is not None
    assert rt.store.unclosed_mlflow_runs(()) == []  # noted: the next start does not close it
