"""``mlops-gpu report``: GPU-hours and cost per project and user from the usage ledger, as JSON
and as a table; a bad ``--since`` is one error line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from conftest import run_cli

from mlops_gpu.config import load_config
from mlops_gpu.model import Phase
from mlops_gpu.state import Store
from mlops_gpu.testing import make_spec
from mlops_gpu.testing.builders import placed


def ledger(cfg_path: Path) -> None:
    """Two runs of project p: 2 GPUs for 1 h (alice), then 1 GPU for 30 min (bob)."""
    store = Store(load_config(cfg_path).store_url)
    try:
        t0 = 1_000_000.0
        for user, gpus, hours in (("alice", ["0", "1"], 1.0), ("bob", ["2"], 0.5)):
            run = store.submit(replace(make_spec("p", len(gpus)), user=user), now=t0)
            assert store.admit(run.id, placed("node-a", gpus), now=t0)
            store.set_handle(run.id, "h", Phase.RUNNING, now=t0)
            assert store.finish(run.id, Phase.SUCCEEDED, "done", now=t0 + hours * 3600)
    finally:
        store.close()


def test_report_json_sums_gpu_hours_and_cost(cfg_path: Path) -> None:
    ledger(cfg_path)
    r = run_cli("--config", str(cfg_path), "report", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # a100-80gb costs $2.5 per GPU-hour: 2 x 1 h + 1 x 0.5 h = 2.5 GPU-hours, $6.25
    assert out["total"] == {"runs": 2, "attempts": 2, "gpu_hours": 2.5, "cost_usd": 6.25}
    assert out["projects"] == [
        {"project": "p", "runs": 2, "attempts": 2, "gpu_hours": 2.5, "cost_usd": 6.25}
    ]
    assert [(u["user"], u["cost_usd"]) for u in out["users"]] == [("alice", 5.0), ("bob", 1.25)]


def test_report_table_and_a_window_that_excludes_old_attempts(cfg_path: Path) -> None:
    ledger(cfg_path)
    table = run_cli("--config", str(cfg_path), "report")
    assert table.returncode == 0 and "TOTAL" in table.stdout and "6.25" in table.stdout
    recent = run_cli("--config", str(cfg_path), "report", "--since", "1h", "--format", "json")
    assert json.loads(recent.stdout)["total"]["attempts"] == 0  # the ledger is from 1970


def test_report_names_a_bad_since(cfg_path: Path) -> None:
    r = run_cli("--config", str(cfg_path), "report", "--since", "soon")
    assert r.returncode == 2 and r.stderr.startswith("mlops-gpu: error: ") and "--since" in r.stderr
