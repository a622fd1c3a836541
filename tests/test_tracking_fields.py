"""What an attempt's MLflow run shows (``tracking.fields``), in the local SQLite store
through the real ``mlflow`` package: the submitting user as MLflow's user, the request as params
(a long command cut to MLflow's limit, marked), rounded metrics, and artifacts under the state
folder (or ``mlflow.artifact_root``), never ``./mlruns`` of the scheduler's working folder."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import ResourceRequest
from mlops_gpu.testing import config_yaml


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def runtime(tmp_path: Path, clock: Clock, mlflow: dict[str, str]) -> Runtime:
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)], projects={"vision": (4, 0)}))
    data["backends"] = {"fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    data["mlflow"] = mlflow
    data["state_dir"] = "state"
    rt = Runtime(parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path))
    rt.__dict__["backends"] = {"fake": FakeBackend("fake", rt.cfg.model_nodes("fake"), clock=clock)}
    return rt


@pytest.mark.parametrize("root", [None, "artifacts-here"])
@pytest.mark.timeout(300)
def test_user_params_rounded_metrics_and_artifacts_in_the_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: str | None
) -> None:
    from mlflow.tracking import MlflowClient

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the scheduler's working folder: nothing may land here
    monkeypatch.setenv("MLOPS_GPU_USER", "alice")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    clock = Clock()
    rt = runtime(tmp_path, clock, {"tracking_uri": uri} | ({"artifact_root": root} if root else {}))
    long_arg = "x" * 7000
    rt.submit(rt.spec(("python", "train.py", "--data", long_arg), project="vision",
                            request=ResourceRequest(gpus=2, gpu_types=("a100-80gb",)),
                            priority="high", max_runtime_s=7200.0,
                            env={"FAKE_DURATION_S": "1000"}))  # fmt: skip
    ctl = Controller(rt, clock=clock)
    ctl.warm()
    assert getattr(ctl.tracker, "wait_ready", lambda _: True)(120)
    clock.now += 12.345  # its wait
    ctl.tick()
    clock.now += 1000
    ctl.tick()
    assert ctl.drain_tracking(60)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vision")
    (mr,) = client.search_runs([exp.experiment_id])
    assert mr.data.tags["mlflow.user"] == "alice"  # MLflow's "Created by" / "User"
    p = mr.data.params
    assert (p["gpus"], p["nodes"], p["gpu_type"], p["priority"], p["max_runtime"]) == (
        "2", "1", "a100-80gb", "high", "7200")  # fmt: skip
    assert len(p["command"]) == 6000 and p["command"].startswith("python train.py --data xxx")
    assert p["command"].endswith("...[truncated]")
    m = mr.data.metrics
    assert m["mlops_gpu.gpu_hours"] == 0.5556  # 2 x 1000 s
    assert m["mlops_gpu.cost_usd"] == round(2000 / 3600 * 2.5, 6)  # $2.50 per GPU-hour
    wait = m["mlops_gpu.queue_wait_s"]  # (the submit is stamped by the wall clock)
    assert wait == pytest.approx(12.3, abs=1) and wait == round(wait, 1)
    where = (tmp_path / (root or "state/mlartifacts")).resolve()
    assert exp.artifact_location == (where / "vision").as_uri()
    assert mr.info.artifact_uri.startswith((where / "vision").as_uri())
    assert not (elsewhere / "mlruns").exists()
