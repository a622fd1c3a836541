"""``mlflow run . --backend mlops-gpu`` in remote mode: with ``MLOPS_GPU_URL`` and
``MLOPS_GPU_TOKEN`` and no config, the project is queued on a real ``mlops-gpu server`` under
the token's identity, runs there, and lands in one MLflow run of the server's tracking store
(a real ``mlflow server``), adopted and closed by the server's scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from team.conftest import Server, no_5xx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mlflow_project"


@pytest.mark.mlflow_server
@pytest.mark.slow
def test_mlflow_run_queues_on_the_server(
    make_server: Callable[..., Server], mlflow_server: str, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    srv = make_server(None, extra={"mlflow": {"tracking_uri": mlflow_server}},
                      env={"PATH": path})  # fmt: skip
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLOPS_GPU_", "MLFLOW_"))}
    env.update(PATH=path, HOME=str(tmp_path / "laptop"), MLOPS_GPU_URL=srv.url,
               MLOPS_GPU_TOKEN=srv.tokens["mem"], MLOPS_GPU_USER="root",
               MLOPS_GPU_CONFIG=str(locked / "mlops-gpu.yaml"))  # fmt: skip
    try:
        r = subprocess.run(
            [sys.executable, "-m", "mlflow", "run", str(EXAMPLE), "--backend", "mlops-gpu",
             "--env-manager", "local", "--experiment-name", "remote-project-test",
             "--backend-config", json.dumps({"project": "p", "gpus": 1}), "-P", "epochs=3"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        locked.chmod(0o700)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stderr.splitlines() if "Queued as mlops-gpu run" in x]
    run_id = line.split("mlops-gpu run ")[1].split()[0]
    with srv.client("mem") as c:
        deadline = time.time() + 180
        while (run := c.get(f"/api/v1/runs/{run_id}").json())["phase"] not in (
            "succeeded", "failed", "cancelled"
        ):  # fmt: skip
            assert time.time() < deadline, run
            time.sleep(0.5)
    assert (run["phase"], run["user"], run["project"]) == ("succeeded", "mem", "p")
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("remote-project-test")
    deadline = time.time() + 30
    while True:
        (mr,) = client.search_runs([exp.experiment_id])  # one run: the scheduler adopted it
        if "mlops_gpu.outcome" in mr.data.tags or time.time() > deadline:
            break
        time.sleep(0.5)
    assert mr.info.status == "FINISHED" and mr.data.tags["mlops_gpu.run_id"] == run_id
    assert mr.data.tags["mlops_gpu.outcome"] == "succeeded"
    assert mr.data.params["epochs"] == "3"
    assert [h.step for h in client.get_metric_history(mr.info.run_id, "loss")] == [0, 1, 2]
    assert not (tmp_path / "laptop" / ".config" / "mlops-gpu").exists()
    no_5xx(srv)
