"""``mlflow run --backend mlops-gpu``: the example project in ``examples/mlflow_project`` is
queued, run and logged through the scheduler, into one MLflow run that carries the project's
parameters, the job's own metrics and the scheduler's tags and cost; bad backend config is an
error naming the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import mlops_gpu as mg
from mlops_gpu.testing import config_yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mlflow_project"


def mlflow_run(
    tmp_path: Path, server: str, backend_config: dict[str, object], *params: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLOPS_GPU_", "MLFLOW_"))}
    # the job's `python` is this interpreter (the project runs in the current environment)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_TRACKING_URI"] = server
    return subprocess.run(
        [sys.executable, "-m", "mlflow", "run", str(EXAMPLE), "--backend", "mlops-gpu",
         "--env-manager", "local", "--experiment-name", "mlflow-project-test",
         "--backend-config", json.dumps(backend_config), *params],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def cfg(tmp_path: Path, mlflow_server: str) -> Path:
    p = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml(projects={"vision": (4, 0)}))
    data["scheduler"] = {"tick_s": 0.1, "idle_exit_s": 2}
    data["mlflow"] = {"tracking_uri": mlflow_server}
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.mlflow_server
@pytest.mark.slow
def test_mlflow_run_queues_runs_and_logs_through_the_scheduler(
    tmp_path: Path, mlflow_server: str, cfg: Path
) -> None:
    from mlflow.tracking import MlflowClient

    r = mlflow_run(tmp_path, mlflow_server, {"project": "vision", "gpus": 2, "config": str(cfg)},
                   "-P", "epochs=4")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    # `mlflow run` returns once queued, naming the scheduled run
    (line,) = [x for x in r.stderr.splitlines() if "Queued as mlops-gpu run" in x]
    scheduled = mg.get_run(line.split("mlops-gpu run ")[1].split()[0], config=cfg)
    assert scheduled.wait(timeout=180) == "succeeded", scheduled.logs()
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("mlflow-project-test")
    # the scheduler's tracking worker closes the attempt in MLflow a moment after it ends
    deadline = time.time() + 30
    while True:
        (run,) = client.search_runs([exp.experiment_id])  # one run: the scheduler adopted it
        if "mlops_gpu.outcome" in run.data.tags or time.time() > deadline:
            break
        time.sleep(0.5)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlops_gpu.run_id"] == scheduled.id
    assert run.data.params["epochs"] == "4"  # the project's parameters, as MLflow logs them
    tags, metrics = run.data.tags, run.data.metrics
    assert tags["mlflow.project.backend"] == "mlops-gpu"
    assert (tags["mlops_gpu.project"], tags["mlops_gpu.attempt"]) == ("vision", "1")
    assert len(tags["mlops_gpu.gpu_uuids"].split(",")) == 2
    assert tags["mlops_gpu.outcome"] == "succeeded" and tags["mlops_gpu.run_id"].startswith("r")
    history = client.get_metric_history(run.info.run_id, "loss")  # logged by the job itself
    assert [h.step for h in history] == [0, 1, 2, 3]
    assert metrics["mlops_gpu.gpu_hours"] > 0
    # (GPU-hours rounded to 4 decimals, cost to 6)
    assert metrics["mlops_gpu.cost_usd"] == pytest.approx(metrics["mlops_gpu.gpu_hours"] * 2.5,
                                                          abs=0.0002)  # fmt: skip


@pytest.mark.mlflow_server
@pytest.mark.slow
def test_bad_backend_config_names_the_key(tmp_path: Path, mlflow_server: str) -> None:
    r = mlflow_run(tmp_path, mlflow_server, {"project": "vision", "gpu": 2})
    assert r.returncode != 0 and "unknown key 'gpu'" in r.stderr
    r = mlflow_run(tmp_path, mlflow_server, {"gpus": 2})
    assert r.returncode != 0 and "'project' is required" in r.stderr


def test_backend_config_types_are_checked() -> None:
    from mlflow.exceptions import MlflowException
    from mlops_gpu_mlflow.project_backend import parse_backend_config

    ok = parse_backend_config({"project": "v", "gpus": 2, "ENV_MANAGER": "local",
                               "SYNCHRONOUS": True})  # fmt: skip
    assert ok == {"project": "v", "gpus": 2}
    for bad, msg in (
        ({"project": "v", "gpus": "2"}, "'gpus' must be a whole number"),
        ({"project": "v", "gpus": True}, "'gpus' must be a whole number"),
        ({"project": "v", "max_runtime": "1h"}, "'max_runtime' must be seconds"),
    ):
        with pytest.raises(MlflowException, match=msg):
            parse_backend_config(bad)  # fmt: skip


@pytest.mark.slow
def test_without_a_tracking_uri_the_run_lands_in_the_schedulers_store(tmp_path: Path) -> None:
    """No ``MLFLOW_TRACKING_URI``: ``mlflow run`` itself resolves MLflow's default store (in its
    working folder); the backend makes the MLflow run in the scheduler's store (the SQLite file
    in its state folder) and the project's experiment, and the scheduler adopts and closes it."""
    from mlflow.tracking import MlflowClient

    cfg = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml(projects={"vision": (4, 0)}))
    data["scheduler"] = {"tick_s": 0.1, "idle_exit_s": 2}
    cfg.write_text(yaml.safe_dump(data))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLOPS_GPU_", "MLFLOW_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    r = subprocess.run(
        [sys.executable, "-m", "mlflow", "run", str(EXAMPLE), "--backend", "mlops-gpu",
         "--env-manager", "local", "-P", "epochs=2", "--backend-config",
         json.dumps({"project": "vision", "gpus": 1, "config": str(cfg)})],
        env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stderr.splitlines() if "Queued as mlops-gpu run" in x]
    scheduled = mg.get_run(line.split("mlops-gpu run ")[1].split()[0], config=cfg)
    assert scheduled.wait(timeout=240) == "succeeded", scheduled.logs()
    client = MlflowClient(f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("vision")
    assert exp is not None
    deadline = time.time() + 60
    while True:
        (run,) = client.search_runs([exp.experiment_id])  # one run: the scheduler adopted it
        if "mlops_gpu.outcome" in run.data.tags or time.time() > deadline:
            break
        time.sleep(0.5)
    assert run.data.tags["mlops_gpu.run_id"] == scheduled.id
    assert run.data.tags["mlflow.project.backend"] == "mlops-gpu"
    assert run.info.status == "FINISHED" and run.data.tags["mlops_gpu.outcome"] == "succeeded"
    assert [h.step for h in client.get_metric_history(run.info.run_id, "loss")] == [0, 1]
    assert run.data.params["epochs"] == "2" and run.data.params["gpus"] == "1"
    if (elsewhere / "mlflow.db").exists():  # (MLflow's CLI may open its default store)
        other = MlflowClient(f"sqlite:///{elsewhere / 'mlflow.db'}")
        assert not other.search_runs([e.experiment_id for e in other.search_experiments()])
