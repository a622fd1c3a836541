"""``mg.sweep``: trials as scheduled runs under one MLflow parent run, within quota; grown onto
borrowed GPUs, whose trials are the ones reclaimed when the lender wants them back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import stop_scheduler

import mlops_gpu as mg
from mlops_gpu.controller import Runtime
from mlops_gpu.model import ACTIVE_PHASES
from mlops_gpu.testing import config_yaml

pytestmark = pytest.mark.slow


def objective(params: dict[str, Any]) -> float:
    time.sleep(float(params.get("hold", 0.3)))
    return (params["x"] - 0.3) ** 2 + (0.0 if params["opt"] == "adam" else 0.5)


def config(tmp_path: Path, projects: dict[str, Any], **extra: Any) -> Path:
    data = yaml.safe_load(config_yaml(projects=projects))
    data["scheduler"] = {"tick_s": 0.1, "idle_exit_s": 10}
    data["retry"] = {"max_attempts": 3, "backoff_s": 0}
    data.update(extra)
    p = tmp_path / "mlops-gpu.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.fixture
def cfg_paths() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for p in made:
        stop_scheduler(p)


@pytest.mark.mlflow_server
def test_eight_trials_on_four_gpus_within_quota_each_in_mlflow(
    tmp_path: Path, mlflow_server: str, cfg_paths: list[Path]
) -> None:
    from mlflow.tracking import MlflowClient

    cfg = config(tmp_path, {"tune": (4, 0)}, mlflow={"tracking_uri": mlflow_server})
    cfg_paths.append(cfg)
    rt = Runtime.load(cfg)
    sw = mg.sweep(objective, {"x": (-1.0, 1.0), "opt": ["adam", "sgd"]}, trials=8,
                  project="tune", gpus_per_trial=1, seed=1, config=cfg, name="t8")  # fmt: skip
    most = 0
    while sw._thread is not None and sw._thread.is_alive():
        held = sum(r.placement.gpu_amount for r in rt.store.list_runs(ACTIVE_PHASES)
                   if r.placement)  # fmt: skip
        most = max(most, int(held))
        time.sleep(0.1)
    sw.wait()
    assert [t.state for t in sw.trials] == ["complete"] * 8
    assert most <= 4
    assert sw.best_value == min(t.value for t in sw.trials if t.value is not None)
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("tune")
    runs = client.search_runs([exp.experiment_id],
                              f"tags.`mlflow.parentRunId` = '{sw.parent_run_id}'")  # fmt: skip
    assert len(runs) == 8 and all("loss" in r.data.metrics and "x" in r.data.params for r in runs)
    parent = client.get_run(sw.parent_run_id or "")
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["best_loss"] == pytest.approx(sw.best_value)


def test_borrowed_trials_are_reclaimed_first(tmp_path: Path, cfg_paths: list[Path]) -> None:
    # tune owns 2 GPUs and may borrow lender's 2 while lender is idle
    cfg = config(tmp_path, {"tune": (2, None), "lender": (2, None)})
    cfg_paths.append(cfg)
    rt = Runtime.load(cfg)
    space = {"x": (-1.0, 1.0), "opt": ["adam"], "hold": [6.0]}
    sw = mg.sweep(objective, space, trials=6, project="tune", seed=2, config=cfg, name="grow")

    def active(project: str) -> list[Any]:
        return [r for r in rt.store.list_runs(ACTIVE_PHASES) if r.project == project]

    deadline = time.time() + 60
    while len(active("tune")) < 4:  # grew onto the lender's idle GPUs
        assert time.time() < deadline, [r.phase.value for r in rt.store.list_runs()]
        time.sleep(0.1)
    trial_ids = {t.run.id for t in sw.trials}
    lender = mg.submit(["sleep", "1"], project="lender", gpus=2, config=cfg)
    assert lender.wait(timeout=90) == "succeeded"
    preempted = {e.run_id for e in rt.store.events() if e.kind == "preempted"}
    assert preempted and preempted <= trial_ids  # only the sweep's trials gave GPUs back
    assert len(preempted) == 2  # as many as the lender needed, no more
    sw.wait(timeout=240)
    assert [t.state for t in sw.trials] == ["complete"] * 6  # the reclaimed ones ran again
