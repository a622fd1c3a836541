"""The ``mlops-gpu`` Prefect worker end to end against a real ``prefect server``: deployment ->
work pool ``mlops-gpu`` -> worker -> scheduler -> local backend -> completed flow run linked to
its MLflow run; project quotas hold across flow runs, which wait as Pending with the reason;
cancelling a flow run cancels its scheduled run and frees its GPUs."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mlops_gpu.controller import Runtime
from mlops_gpu.model import ACTIVE_PHASES

from .conftest import PrefectSetup, mlops_config

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def api_call(api: str, method: str, path: str, body: Any = None) -> Any:
    """One call to Prefect's REST API. A 503 is Prefect's "retry" (its SQLite database was
    busy: on a loaded CI machine the worker's polling and the flows' writes meet), and is
    retried as Prefect's own client does (``PREFECT_CLIENT_MAX_RETRIES``, 5, backing off)."""
    data = None if body is None else json.dumps(body).encode()
    for attempt in range(6):
        req = urllib.request.Request(f"{api}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == 5:
                raise
            time.sleep(2**attempt)
            continue
        return json.loads(raw) if raw else None
    raise AssertionError("unreachable")


def flow_run(api: str, fid: str) -> dict[str, Any]:
    out: dict[str, Any] = api_call(api, "GET", f"/flow_runs/{fid}")
    return out


def until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    each: Callable[[], None] | None = None,
) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if each is not None:
            each()
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _never() -> Any:
    raise AssertionError("the scheduled run is not in the store")


@pytest.fixture
def setup_factory(prefect_api: str, tmp_path: Path) -> Iterator[Callable[..., PrefectSetup]]:
    made: list[PrefectSetup] = []

    def make(
        projects: dict[str, tuple[int, int | None]], gpus: int = 2, **extra: Any
    ) -> PrefectSetup:
        cfg = mlops_config(tmp_path, projects, **extra)
        s = PrefectSetup(prefect_api, tmp_path, cfg, list(projects), gpus)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
        print((s.d / "worker.log").read_text()[-3000:])


@pytest.mark.mlflow_server
def test_a_deployment_runs_through_the_scheduler_and_links_its_mlflow_run(
    prefect_api: str, mlflow_server: str, setup_factory: Callable[..., PrefectSetup]
) -> None:
    from mlflow.tracking import MlflowClient

    s = setup_factory({"vision": (4, 0)}, mlflow={"tracking_uri": mlflow_server})
    fid = s.run("vision", 1)
    until(lambda: flow_run(prefect_api, fid)["state"]["type"] in ("COMPLETED", "FAILED",
          "CRASHED", "CANCELLED"), 180, "the flow run to end")  # fmt: skip
    fr = flow_run(prefect_api, fid)
    assert fr["state"]["type"] == "COMPLETED", fr["state"]
    run_id = fr["infrastructure_pid"]
    rt = Runtime.load(s.cfg)
    # the flow is done in Prefect a moment before its process has exited
    until(lambda: (rt.store.get(run_id) or _never()).phase.value != "running", 30, "the run")
    run = rt.store.get(run_id)
    assert run is not None and run.phase.value == "succeeded" and run.project == "vision"
    assert len(run.placement.slots[0].devices) == 2 if run.placement else False
    arts = api_call(prefect_api, "POST", "/artifacts/filter",
                    {"artifacts": {"flow_run_id": {"any_": [fid]}}})  # fmt: skip
    (art,) = [a for a in arts if (a.get("key") or "").startswith("mlflow-run-")]

    def mlflow_runs() -> list[Any]:
        return MlflowClient(mlflow_server).search_runs(
            [e.experiment_id for e in MlflowClient(mlflow_server).search_experiments()],
            f"tags.`mlops_gpu.run_id` = '{run_id}'",
        )

    # the scheduler closes MLflow runs a moment after the store says they ended
    until(lambda: [r.info.status for r in mlflow_runs()] == ["FINISHED"], 30, "the MLflow run")
    (mr,) = mlflow_runs()
    assert mr.info.run_id in art["data"] and mr.info.status == "FINISHED"


def test_quota_holds_across_flow_runs_and_waiting_runs_say_why(
    prefect_api: str, setup_factory: Callable[..., PrefectSetup]
) -> None:
    s = setup_factory({"vision": (2, 0), "nlp": (2, 0)})
    rt = Runtime.load(s.cfg)
    vision = [s.run("vision", 2) for _ in range(6)]
    messages: set[str] = set()
    most = [0]
    nlp_started: list[float] = []

    def sample() -> None:
        active = rt.store.list_runs(ACTIVE_PHASES)
        most[0] = max(most[0], sum(1 for r in active if r.project == "vision"))
        for fid in vision:
            st = flow_run(prefect_api, fid)["state"]
            if st["type"] == "PENDING" and st.get("message"):
                messages.add(st["message"])

    until(lambda: len(rt.store.list_runs(ACTIVE_PHASES)) > 0, 120, "the first run", sample)
    t0 = time.time()
    nlp = s.run("nlp", 1)

    def nlp_running() -> bool:
        ok = any(r.project == "nlp" for r in rt.store.list_runs(ACTIVE_PHASES))
        if ok and not nlp_started:
            nlp_started.append(time.time() - t0)
        return ok or flow_run(prefect_api, nlp)["state"]["type"] == "COMPLETED"

    until(nlp_running, 60, "the nlp run to start", sample)
    done = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
    until(lambda: all(flow_run(prefect_api, f)["state"]["type"] in done for f in [*vision, nlp]),
          400, "every flow run to end", sample)  # fmt: skip
    assert all(flow_run(prefect_api, f)["state"]["type"] == "COMPLETED" for f in [*vision, nlp])
    assert most[0] == 1  # 2 GPUs each against a nominal quota of 2, no borrowing
    assert any("waiting for GPUs" in m and "quota" in m for m in messages), messages
    assert nlp_started and nlp_started[0] < 15  # at once, beside the vision queue


def test_cancelling_a_flow_run_cancels_its_scheduled_run_and_frees_its_gpus(
    prefect_api: str, setup_factory: Callable[..., PrefectSetup]
) -> None:
    s = setup_factory({"vision": (4, 0)})
    rt = Runtime.load(s.cfg)
    fid = s.run("vision", 120)
    until(lambda: flow_run(prefect_api, fid)["state"]["type"] == "RUNNING", 180, "running")
    run_id = flow_run(prefect_api, fid)["infrastructure_pid"]
    t0 = time.time()
    api_call(prefect_api, "POST", f"/flow_runs/{fid}/set_state",
             {"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True})  # fmt: skip

    def freed() -> bool:
        r = rt.store.get(run_id)
        return r is not None and r.phase.value == "cancelled"

    until(freed, 30, "the scheduled run to be cancelled")
    took = time.time() - t0
    assert rt.store.list_runs(ACTIVE_PHASES) == []  # its GPUs are free
    assert took < 5, f"took {took:.1f}s"
    until(lambda: flow_run(prefect_api, fid)["state"]["type"] == "CANCELLED", 60, "cancelled")
