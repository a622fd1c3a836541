"""``mlops-gpu demo``: finishes, succeeds, summarises per project, leaves nothing running."""

from __future__ import annotations

import json
import os
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


def test_demo_leaves_tracking_to_mlflow_env(tmp_path: Path) -> None:
    from mlops_gpu.cli.demo import write_demo_config

    os.environ["MLFLOW_TRACKING_URI"] = "http://127.0.0.1:5999"
    try:
        cfg = yaml.safe_load(write_demo_config(tmp_path).read_text())
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    assert cfg["mlflow"]["tracking_uri"] is None
