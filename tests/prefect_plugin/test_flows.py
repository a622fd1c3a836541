"""The ``flows/`` folder: ``prefect deploy --all`` with its ``prefect.yaml`` against a real
Prefect server, the training flow run end to end through an ``mlops-gpu`` worker into MLflow,
and the usage-report flow writing its files and artifact."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mlops_gpu.model import Phase
from mlops_gpu.testing import make_spec
from mlops_gpu.testing.builders import placed

from .conftest import PREFECT, mlops_config, prefect_env
from .test_worker import api_call, flow_run, until

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]
FLOWS = Path(__file__).resolve().parents[2] / "flows"


@pytest.mark.mlflow_server
def test_prefect_deploy_and_the_training_flow_end_to_end(
    prefect_api: str, mlflow_server: str, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    flows = tmp_path / "flows"
    shutil.copytree(FLOWS, flows)
    cfg = mlops_config(tmp_path, {"vision": (4, 0)}, mlflow={"tracking_uri": mlflow_server})
    env = prefect_env(prefect_api, tmp_path / "home")
    env["MLOPS_GPU_FLOWS_DIR"] = str(flows)

    def cli(*args: str) -> str:
        r = subprocess.run([PREFECT, *args], env=env, cwd=flows, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    cli("work-pool", "create", "mlops-gpu", "--type", "mlops-gpu", "--overwrite")
    cli("deploy", "--all")
    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "mlops-gpu"], env=env,
                              cwd=tmp_path, stdout=open(tmp_path / "worker.log", "w"),  # noqa: SIM115
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        out = cli("deployment", "run", "train/train", "--param", "epochs=5", "--job-variable",
                  "project=vision", "--job-variable", f"config={cfg}")  # fmt: skip
        fid = next(w for w in out.split() if len(w) == 36 and w.count("-") == 4)
        done = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
        until(lambda: flow_run(prefect_api, fid)["state"]["type"] in done, 240, "the flow run")
        assert flow_run(prefect_api, fid)["state"]["type"] == "COMPLETED"
        run_id = flow_run(prefect_api, fid)["infrastructure_pid"]
        client = MlflowClient(mlflow_server)
        exps = [e.experiment_id for e in client.search_experiments()]
        (mr,) = client.search_runs(exps, f"tags.`mlops_gpu.run_id` = '{run_id}'")
        history = client.get_metric_history(mr.info.run_id, "loss")
        assert [h.step for h in history] == [0, 1, 2, 3, 4]  # the flow's own metrics
        assert mr.data.params["epochs"] == "5" and mr.data.tags["mlops_gpu.project"] == "vision"
        deps = api_call(prefect_api, "POST", "/deployments/filter", {})
        report = [d for d in deps if d["name"] == "usage-report"]
        assert report and report[0]["schedules"]  # the daily schedule of prefect.yaml
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        from conftest import stop_scheduler

        stop_scheduler(cfg)


def test_the_usage_report_flow_writes_files_and_an_artifact(harness: None, tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(FLOWS))
    try:
        from usage_report import usage_report
    finally:
        sys.path.remove(str(FLOWS))
    from mlops_gpu.controller import Runtime

    cfg = mlops_config(tmp_path, {"vision": (4, 0)})
    store = Runtime.load(cfg).store
    now = time.time()
    run = store.submit(replace(make_spec("vision", 2), user="ada"), now=now - 7200)
    assert store.admit(run.id, placed("node-a", ["0", "1"]), now=now - 7200)
    store.set_handle(run.id, "h", Phase.RUNNING, now=now - 7200)
    assert store.finish(run.id, Phase.SUCCEEDED, "done", now=now - 3600)
    out = tmp_path / "reports"
    rep = usage_report(days=1, out_dir=str(out), config=str(cfg))
    assert rep["total"]["gpu_hours"] == pytest.approx(2.0) and rep["rows"][0]["key"] == "vision"
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 4 and any(f.endswith("by-user.csv") for f in files)
    by_user = json.loads(next(out.glob("*by-user.json")).read_text())
    assert by_user["rows"][0]["key"] == "ada"


@pytest.mark.mlflow_server
def test_the_sweep_flow_runs_eight_trials_on_four_gpus(
    harness: None, tmp_path: Path, mlflow_server: str
) -> None:
    import importlib.util
    import threading

    from mlflow.tracking import MlflowClient

    from mlops_gpu.controller import Runtime
    from mlops_gpu.model import ACTIVE_PHASES

    spec = importlib.util.spec_from_file_location("flows_sweep_under_test", FLOWS / "sweep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # as Prefect loads it: a module no job can import
    cfg = mlops_config(tmp_path, {"tune": (4, 0)}, mlflow={"tracking_uri": mlflow_server})
    rt = Runtime.load(cfg)
    most, stop = [0.0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            held = sum(r.placement.gpu_amount for r in rt.store.list_runs(ACTIVE_PHASES)
                       if r.placement)  # fmt: skip
            most[0] = max(most[0], held)
            time.sleep(0.1)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        out = module.sweep(trials=8, project="tune", config=str(cfg))
    finally:
        stop.set()
        watcher.join()
        from conftest import stop_scheduler

        stop_scheduler(cfg)
    assert most[0] <= 4 and out["best_value"] < 1.0
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("tune")
    runs = client.search_runs([exp.experiment_id],
                              f"tags.`mlflow.parentRunId` = '{out['parent_run_id']}'")  # fmt: skip
    assert len(runs) == 8 and all(r.info.status == "FINISHED" for r in runs)
    assert all({"loss", "train_loss"} <= set(r.data.metrics) for r in runs)
