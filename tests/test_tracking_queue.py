"""MLflow closes off the tick's path (``tracking.close_queue``): a tick does not wait for
MLflow; a close lost to a stop is made at the next start from the store; the v5 migration notes
old attempts closed so an upgraded store is not closed twice. The local SQLite MLflow store (the
embedded default) through the real ``mlflow`` package; one slow-client test uses a stub. Each
test on a SQLite and on a real PostgreSQL state store (``store_url``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import delete, select

from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import ACTIVE_PHASES, ResourceRequest
from mlops_gpu.model import Run as RunRecord
from mlops_gpu.state import mlflow_legacy
from mlops_gpu.state.migrations import LATEST
from mlops_gpu.state.schema import events, schema_version
from mlops_gpu.state.schema import mlflow_runs as mlflow_table
from mlops_gpu.state.store import Store
from mlops_gpu.testing import config_yaml
from mlops_gpu.tracking import tracker as tracker_module
from mlops_gpu.tracking.close_queue import Ended


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def runtime(tmp_path: Path, clock: Clock, store_url: str) -> Runtime:
    """On the store ``store_url`` (the fixture's: each test runs on SQLite and PostgreSQL)."""
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)], projects={"vision": (4, 0)}))
    data["store"] = store_url
    data["backends"] = {"fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    data["mlflow"] = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    rt = Runtime(parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path))
    rt.__dict__["backends"] = {"fake": FakeBackend("fake", rt.cfg.model_nodes("fake"), clock=clock)}
    return rt


def mlflow_runs(tmp_path: Path, run_id: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(exps, f"tags.`mlops_gpu.run_id` = '{run_id}'")
    return sorted(found, key=lambda r: int(r.data.tags["mlops_gpu.attempt"]))


def ready(ctl: Controller) -> Controller:
    """A controller whose MLflow store is open, as a daemon's is by its start (``warm``): a
    launch waits for MLflow only briefly, and opening a new store takes longer."""
    ctl.warm()
    assert ctl.tracker.wait_ready(120)
    return ctl


def kinds(store: Store, run_id: str) -> list[tuple[int, str]]:
    """The run's MLflow runs as the store noted them (``mlflow_runs``): (attempt, "open" or
    "closed") per MLflow run, each attempt's in the order noted."""
    return [(m.attempt, "open" if m.closed_at is None else "closed")
            for m in store.mlflow_links(run_id)]  # fmt: skip


def test_a_close_lost_to_a_stop_is_made_at_the_next_start_from_the_ledger(
    tmp_path: Path, store_url: str
) -> None:
    clock = Clock()
    rt = runtime(tmp_path, clock, store_url)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=2),
                            env={"FAKE_DURATION_S": "1800"}))  # fmt: skip
    ctl = ready(Controller(rt, clock=clock))
    clock.now += 30  # 30 s in the queue
    ctl.tick()
    ctl.tracking.put = lambda items: None  # type: ignore[method-assign]  # the stop comes first
    clock.now += 1800
    ctl.tick()
    (mr,) = mlflow_runs(tmp_path, run.id)
    assert mr.info.status == "RUNNING"  # the scheduler stopped before closing it
    assert kinds(rt.store, run.id) == [(1, "open")]
    again = ready(Controller(rt, clock=clock))
    again.reconcile()  # the next start: the close is queued again
    assert again.drain_tracking()
    (mr,) = mlflow_runs(tmp_path, run.id)
    assert mr.info.status == "FINISHED" and mr.data.tags["mlops_gpu.outcome"] == "succeeded"
    m = mr.data.metrics
    assert m["mlops_gpu.gpu_hours"] == pytest.approx(1.0)  # 2 GPUs x 30 min, from the ledger
    assert m["mlops_gpu.cost_usd"] == pytest.approx(2.5)
    assert m["mlops_gpu.queue_wait_s"] == pytest.approx(30.0, abs=1.0)
    assert kinds(rt.store, run.id) == [(1, "closed")]
    assert again.reconcile() == 0 and rt.store.unclosed_mlflow_runs(()) == []  # closed once


def test_a_running_attempt_is_not_closed_by_a_start(tmp_path: Path, store_url: str) -> None:
    clock = Clock()
    rt = runtime(tmp_path, clock, store_url)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={"FAKE_DURATION_S": "1800"}))  # fmt: skip
    ready(Controller(rt, clock=clock)).tick()
    again = ready(Controller(rt, clock=clock))
    again.reconcile()
    assert again.drain_tracking()
    (mr,) = mlflow_runs(tmp_path, run.id)
    assert mr.info.status == "RUNNING" and kinds(rt.store, run.id) == [(1, "open")]


def test_release_closes_what_ended(tmp_path: Path, store_url: str) -> None:
    clock = Clock()
    rt = runtime(tmp_path, clock, store_url)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={"FAKE_DURATION_S": "60"}))  # fmt: skip
    ctl = ready(Controller(rt, clock=clock))
    ctl.tick()
    clock.now += 60
    ctl.tick()
    ctl.release()
    (mr,) = mlflow_runs(tmp_path, run.id)
    assert mr.info.status == "FINISHED"
    assert kinds(rt.store, run.id) == [(1, "closed")]


class SlowClient:
    """An MLflow client whose writes wait for ``go``: a tick must not."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.closed: list[tuple[str, str]] = []

    def log_batch(self, run_id: str, metrics: Sequence[Any], tags: Mapping[str, str]) -> None:
        assert self.go.wait(10)

    def finish(self, run_id: str, status: str = "FINISHED", end: float | None = None) -> None:
        self.closed.append((run_id, status))


def test_a_tick_does_not_wait_for_mlflow(tmp_path: Path, store_url: str) -> None:
    clock = Clock()
    rt = runtime(tmp_path, clock, store_url)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={"FAKE_DURATION_S": "60"}))  # fmt: skip
    ctl = ready(Controller(rt, clock=clock))
    ctl.tick()
    got = rt.store.get(run.id)
    assert got is not None
    mine = rt.store.mlflow_run_id(run.id, 1)
    assert mine is not None and ctl.tracker._ids[(run.id, 1)] == mine
    slow = SlowClient()
    ctl.tracker.rest = slow  # type: ignore[assignment]
    clock.now += 60
    t0 = time.monotonic()
    ctl.tick()  # the run ends: its close is queued, the tick goes on
    assert time.monotonic() - t0 < 5 and ctl.tracking.pending() == 1
    assert not ctl.drain_tracking(0.2)
    assert kinds(rt.store, run.id) == [(1, "open")]  # (not noted before MLflow took it)
    slow.go.set()
    assert ctl.drain_tracking(10) and slow.closed == [(mine, "FINISHED")]
    assert kinds(rt.store, run.id) == [(1, "closed")]
    ctl.tracking.put([Ended(got, "failed", clock.now)])  # (no MLflow run for it: no note)
    assert ctl.drain_tracking(10) and kinds(rt.store, run.id) == [(1, "closed")]


def test_the_v5_migration_notes_old_attempts_closed(tmp_path: Path, store_url: str) -> None:
    """Before v5 closes happened in the tick and were not noted: an upgraded store must not
    have them all closed again at its first start."""
    clock = Clock()
    rt = runtime(tmp_path, clock, store_url)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={"FAKE_DURATION_S": "60"}))  # fmt: skip
    live = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                             env={"FAKE_DURATION_S": "6000"}))  # fmt: skip
    ctl = ready(Controller(rt, clock=clock))
    ctl.tick()
    clock.now += 60
    ctl.tick()
    ctl.release()
    made = {r: rt.store.mlflow_run_id(r, 1) for r in (run.id, live.id)}
    with rt.store.engine.begin() as conn:  # the store as v4 left it: noted, never closed
        conn.execute(delete(events).where(events.c.kind.in_(("mlflow_run", "mlflow_closed"))))
        conn.execute(events.insert(), [
            {"run_id": r, "time": clock.now, "kind": "mlflow_run", "attempt": 1, "reason": m}
            for r, m in made.items()
        ])  # fmt: skip
        mlflow_table.drop(conn)
        conn.execute(schema_version.update().values(version=4))
        assert [k[0] for k in mlflow_legacy.unclosed_ids(conn, ())] == sorted(made)
    reopened = Store(rt.cfg.store_url)
    assert reopened.unclosed_mlflow_runs(ACTIVE_PHASES) == []
    with reopened.engine.connect() as conn:
        assert conn.execute(select(schema_version.c.version)).scalar_one() == LATEST
    assert kinds(reopened, run.id) == [(1, "closed")]
    assert kinds(reopened, live.id) == [(1, "open")]  # still running: closed when it ends
    assert {r: reopened.mlflow_run_id(r, 1) for r in made} == made


def first_launch_fails(tmp_path: Path, clock: Clock, store_url: str) -> tuple[Runtime, RunRecord]:
    """A long run whose first launch fails (the fake backend's ``fail_launches``)."""
    rt = runtime(tmp_path, clock, store_url)
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    fake.fail_launches = 1
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={"FAKE_DURATION_S": "6000"}))  # fmt: skip
    return rt, run


def test_a_failed_launch_is_closed_failed_and_its_retry_left_running(
    tmp_path: Path, store_url: str
) -> None:
    """A launch that failed is tried again under the same attempt number: two MLflow runs for
    attempt 1. A start closes the first (it never held GPUs), never the one that runs."""
    clock = Clock()
    rt, run = first_launch_fails(tmp_path, clock, store_url)
    ctl = ready(Controller(rt, clock=clock))
    ctl.tracking.put = lambda items: None  # type: ignore[method-assign]  # closes lost
    ctl.tick()  # the launch fails: rolled back
    clock.now += 60
    ctl.tick()  # launched again, attempt 1 still
    got = rt.store.get(run.id)
    assert got is not None and got.attempt == 1 and got.phase.value in ("starting", "running")
    assert kinds(rt.store, run.id) == [(1, "open"), (1, "open")]
    again = ready(Controller(rt, clock=clock))
    again.reconcile()
    assert again.drain_tracking()
    failed, running = sorted(mlflow_runs(tmp_path, run.id), key=lambda r: r.info.start_time)
    assert failed.info.status == "FAILED"
    assert failed.data.tags["mlops_gpu.outcome"] == "launch_failed"
    assert running.info.status == "RUNNING"
    assert kinds(rt.store, run.id) == [(1, "closed"), (1, "open")]


def test_a_failed_launch_closed_after_its_retry_started_closes_its_own_run(
    tmp_path: Path, store_url: str
) -> None:
    """The retry (same attempt number) gets its MLflow run before the worker closes the failed
    one: the close must reach the failed launch's run, not the retry's."""
    clock = Clock()
    rt, run = first_launch_fails(tmp_path, clock, store_url)
    ctl = ready(Controller(rt, clock=clock))
    with ctl.tracking.priority():  # the worker closes nothing until both ticks are done
        ctl.tick()  # the launch fails
        clock.now += 60
        ctl.tick()  # the retry runs
    assert ctl.drain_tracking(30)
    failed, running = sorted(mlflow_runs(tmp_path, run.id), key=lambda r: r.info.start_time)
    assert failed.info.status == "FAILED" and running.info.status == "RUNNING"
    assert failed.data.tags["mlops_gpu.outcome"] == "launch_failed"
    assert "mlops_gpu.outcome" not in running.data.tags


class Killed(BaseException):
    """The scheduler process dies here (not an ``Exception``: nothing on the way catches it)."""


@pytest.fixture
def patient_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow calls on the tick's path wait until MLflow answers, as they do on a machine that
    is not loaded (1.5 s at most, ``LAUNCH_WAIT_S``). On a loaded CI machine making a run once
    took longer: the launch went on without it and the late answer noted it on the MLflow
    thread, not through the ``note_mlflow`` these tests kill (the late path has its tests)."""
    monkeypatch.setattr(tracker_module, "LAUNCH_WAIT_S", 120.0)


def stopped_mid_launch(
    tmp_path: Path, clock: Clock, where: str, store_url: str
) -> tuple[Runtime, RunRecord]:
    """A tick that dies after the attempt's MLflow run was made: before its job is created
    (``where="launch"``) or after, before the store noted either (``where="note"``). Its
    tests use ``patient_mlflow``."""
    rt = runtime(tmp_path, clock, store_url)
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1),
                            env={"FAKE_DURATION_S": "600"}))  # fmt: skip
    ctl = ready(Controller(rt, clock=clock))

    def die(*args: object, **kwargs: object) -> None:
        raise Killed

    target = rt.backends["fake"] if where == "launch" else rt.store
    name = "launch" if where == "launch" else "note_mlflow"
    original = getattr(target, name)
    setattr(target, name, die)
    with pytest.raises(Killed):
        ctl.tick()
    setattr(target, name, original)
    got = rt.store.get(run.id)
    assert got is not None and got.phase.value == "admitted" and got.handle is None
    (mr,) = mlflow_runs(tmp_path, run.id)
    assert mr.info.status == "RUNNING" and kinds(rt.store, run.id) == []  # made, not noted
    return rt, run


@pytest.mark.usefixtures("patient_mlflow")
def test_a_stop_before_the_launch_closes_the_attempts_mlflow_run_at_the_next_start(
    tmp_path: Path, store_url: str
) -> None:
    """No job was created: the next start rolls the admission back and closes the MLflow run
    it finds by its tags FAILED (it never held GPUs); the relaunch gets its own run."""
    clock = Clock()
    rt, run = stopped_mid_launch(tmp_path, clock, "launch", store_url)
    again = ready(Controller(rt, clock=clock))
    assert again.reconcile() == 1
    assert again.drain_tracking()
    (orphan,) = mlflow_runs(tmp_path, run.id)
    assert orphan.info.status == "FAILED"
    assert orphan.data.tags["mlops_gpu.outcome"] == "launch_failed"
    assert kinds(rt.store, run.id) == [(1, "closed")]
    clock.now += 1
    again.tick()  # launched again, attempt 1 still, with a new MLflow run
    clock.now += 600
    again.tick()
    assert again.drain_tracking()
    failed, finished = sorted(mlflow_runs(tmp_path, run.id), key=lambda r: r.info.start_time)
    assert failed.info.run_id == orphan.info.run_id and failed.info.status == "FAILED"
    assert finished.info.status == "FINISHED"
    assert finished.data.tags["mlops_gpu.outcome"] == "succeeded"
    again.reconcile()
    assert again.drain_tracking() and rt.store.unclosed_mlflow_runs(()) == []


@pytest.mark.usefixtures("patient_mlflow")
def test_a_stop_after_the_launch_keeps_the_attempts_mlflow_run(
    tmp_path: Path, store_url: str
) -> None:
    """The job exists: the next start adopts it and notes the MLflow run found by its tags,
    which the attempt's end closes, once; no second MLflow run is made."""
    clock = Clock()
    rt, run = stopped_mid_launch(tmp_path, clock, "note", store_url)
    again = ready(Controller(rt, clock=clock))
    assert again.reconcile() == 1
    (mr,) = mlflow_runs(tmp_path, run.id)
    assert mr.info.status == "RUNNING" and kinds(rt.store, run.id) == [(1, "open")]
    clock.now += 600
    again.tick()
    again.tick()
    assert again.drain_tracking()
    (mr,) = mlflow_runs(tmp_path, run.id)
    assert mr.info.status == "FINISHED" and mr.data.tags["mlops_gpu.outcome"] == "succeeded"
    assert kinds(rt.store, run.id) == [(1, "closed")]


def test_an_adopted_mlflow_run_is_not_closed_by_a_failed_launch(
    tmp_path: Path, store_url: str
) -> None:
    """The first attempt logs into the submitter's MLflow run (``mlflow run``): a launch that
    fails and is tried again adopts that same run, so the failure must not close it, nor a
    start take it for a failed launch's leftover; the attempt's end closes it, once."""
    from mlflow.tracking import MlflowClient

    clock = Clock()
    rt = runtime(tmp_path, clock, store_url)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mine = client.create_run(client.create_experiment("mine")).info.run_id
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    fake.fail_launches = 1
    env = {"FAKE_DURATION_S": "600", "MLOPS_GPU_MLFLOW_RUN_ID": mine}
    run = rt.submit(rt.spec(("train",), project="vision", request=ResourceRequest(gpus=1), env=env))
    ready(Controller(rt, clock=clock)).tick()  # the launch fails: rolled back
    ctl = ready(Controller(rt, clock=clock))  # a restart while it waits for its retry
    ctl.reconcile()
    assert ctl.drain_tracking()
    assert client.get_run(mine).info.status == "RUNNING"
    clock.now += 60
    ctl.tick()  # launched again, adopting the same MLflow run
    assert ctl.drain_tracking()
    assert client.get_run(mine).info.status == "RUNNING"
    again = ready(Controller(rt, clock=clock))  # a restart while it runs
    again.reconcile()
    assert again.drain_tracking()
    assert client.get_run(mine).info.status == "RUNNING"
    assert [m.info.run_id for m in mlflow_runs(tmp_path, run.id)] == [mine]
    clock.now += 600
    again.tick()
    again.tick()
    assert again.drain_tracking()
    done = client.get_run(mine)
    assert done.info.status == "FINISHED" and done.data.tags["mlops_gpu.outcome"] == "succeeded"
    again.reconcile()
    assert again.drain_tracking() and rt.store.unclosed_mlflow_runs(()) == []
