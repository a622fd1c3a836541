"""``mlops-gpu demo``: finishes, succeeds, summarises per project, leaves nothing running."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from conftest import run_cli


def processes_mentioning(text: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if text.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    d = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    r = run_cli("demo", "--dir", str(d), env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for project in ("vision", "nlp", "research"):
        assert project in r.stdout
    assert "Per-project summary" in r.stdout and "ALLOCATED UTIL" in r.stdout
    assert f"--config {d / 'mlops-gpu.yaml'} status" in r.stdout
    cfg = yaml.safe_load((d / "mlops-gpu.yaml").read_text())
    assert cfg["mlflow"]["tracking_uri"] == "sqlite:///mlflow.db"
    runs = json.loads(run_cli("--config", str(d / "mlops-gpu.yaml"), "status", "--json").stdout)
    assert len(runs) == 12 and {x["phase"] for x in runs} == {"succeeded"}
    assert any(x["gpus"] == 2 for x in runs) and any(x["priority"] == "high" for x in runs)
    assert processes_mentioning(str(d)) == []  # nothing left running
    log = (d / "state" / "runs" / runs[0]["id"] / "1" / "stdout.log").read_text()
    assert "epoch" in log
    # it ends by pointing at the report and at the MLflow UI of its own store
    assert f"mlops-gpu --config {d / 'mlops-gpu.yaml'} report" in r.stdout
    assert f"mlflow ui --backend-store-uri sqlite:///{d / 'mlflow.db'}" in r.stdout
    # its queue wait is the report's (one definition: admission minus joining the queue)
    shown = dict(re.findall(r"^│ (\w+)\s+│.*│\s+([\d.]+) s │[^│]*│$", r.stdout, re.M))
    rep = json.loads(run_cli("--config", str(d / "mlops-gpu.yaml"), "report", "--format",
                             "json").stdout)  # fmt: skip
    assert shown and shown == {
        row["key"]: f"{row['mean_wait_s']:.1f}" for row in rep["rows"] if row["mean_wait_s"]
    }


def test_demo_leaves_tracking_to_mlflow_env(tmp_path: Path) -> None:
    from mlops_gpu.cli.demo import write_demo_config

    os.environ["MLFLOW_TRACKING_URI"] = "http://127.0.0.1:5999"
    try:
        cfg = yaml.safe_load(write_demo_config(tmp_path).read_text())
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    assert cfg["mlflow"]["tracking_uri"] is None


@pytest.mark.slow
@pytest.mark.mlflow_server
def test_demo_into_an_mlflow_server_matches_the_report(tmp_path: Path, mlflow_server: str) -> None:
    """The issue's acceptance: one MLflow run per scheduled attempt with the scheduler's tags
    and metrics, and the report's total cost equal to MLflow's sum to the cent."""
    import mlflow

    d = tmp_path / "demo"
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server}
    r = run_cli("demo", "--dir", str(d), env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = str(d / "mlops-gpu.yaml")
    runs = json.loads(run_cli("--config", cfg, "status", "--json").stdout)
    attempts = {(x["id"], str(a)) for x in runs for a in range(1, x["attempt"] + 1)}
    mlflow.set_tracking_uri(mlflow_server)
    found = mlflow.search_runs(search_all_experiments=True, output_format="list",
                               filter_string="tags.`mlops_gpu.run_id` != ''")  # fmt: skip
    found = [m for m in found if m.data.tags["mlops_gpu.run_id"] in {x["id"] for x in runs}]
    assert {(m.data.tags["mlops_gpu.run_id"], m.data.tags["mlops_gpu.attempt"]) for m in found} \
        == attempts and len(found) == len(attempts)  # fmt: skip
    projects = {x["id"]: x["project"] for x in runs}
    for m in found:
        tags, metrics = m.data.tags, m.data.metrics
        for key in ("project", "user", "priority", "backend", "nodes", "gpu_type", "gpu_uuids"):
            assert tags[f"mlops_gpu.{key}"], key
        assert tags["mlops_gpu.project"] == projects[tags["mlops_gpu.run_id"]]
        assert tags["mlops_gpu.backend"] == "local" and m.info.status in ("FINISHED", "KILLED")
        for key in ("queue_wait_s", "gpu_hours", "cost_usd"):
            assert f"mlops_gpu.{key}" in metrics, key
    rep = run_cli("--config", cfg, "report", "--format", "json")
    assert rep.returncode == 0, rep.stderr
    total = json.loads(rep.stdout)["total"]["cost_usd"]
    logged = sum(m.data.metrics["mlops_gpu.cost_usd"] for m in found)
    assert round(total, 2) == round(logged, 2) and total > 0
