"""The CLI end to end on the local backend, with the scheduler it starts by itself."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from conftest import run_cli

from mlops_gpu.config import load_config
from mlops_gpu.controller import Runtime
from mlops_gpu.controller.daemon import scheduler_running
from mlops_gpu.testing import config_yaml


def test_submit_then_logs_shows_two_devices(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml())
    data["scheduler"] = {"tick_s": 0.1, "idle_exit_s": 1}
    cfg.write_text(yaml.safe_dump(data))
    r = run_cli(
        "--config",
        str(cfg),
        "submit",
        "--project",
        "p",
        "--gpus",
        "2",
        "--",
        "python",
        "-c",
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
    )
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    deadline = time.time() + 30
    while time.time() < deadline:
        st = json.loads(run_cli("--config", str(cfg), "status", run_id, "--json").stdout)[0]
        if st["phase"] in ("succeeded", "failed"):
            break
        time.sleep(0.2)
    assert st["phase"] == "succeeded", st
    logs = run_cli("--config", str(cfg), "logs", run_id)
    devices = logs.stdout.strip().split(",")
    assert len(devices) == 2 and all(d.isdigit() for d in devices)
    assert devices == st["devices"]
    (with_events,) = json.loads(
        run_cli("--config", str(cfg), "status", run_id, "--events", "--json").stdout
    )
    # phase changes only: notes (e.g. the attempt's MLflow run) have no phase_to
    phases = [e["phase_to"] for e in with_events["events"] if e["phase_to"]]
    # "running" shows unless the job ended before the scheduler first looked at it
    assert phases[:3] == ["pending", "admitted", "starting"] and phases[-1] == "succeeded"
    assert with_events["events"][1]["reason"].startswith("placed on node-a")
    # the auto-started scheduler exits by itself once idle
    rt = Runtime(load_config(cfg))
    deadline = time.time() + 15
    while scheduler_running(rt):
        assert time.time() < deadline, "the background scheduler did not exit when idle"
        time.sleep(0.3)
    assert "scheduler started" in (tmp_path / "state" / "scheduler.log").read_text()


def test_queue_shows_reasons_and_cancel_pending(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(projects={"p": (2, 0)}))
    ids = [
        run_cli(
            "--config", str(cfg), "submit", "--no-start", "-p", "p", "-g", "2", "--", "sleep", "5"
        ).stdout.strip()
        for _ in range(2)
    ]
    r = run_cli("--config", str(cfg), "scheduler", "--once")
    assert r.returncode == 0, r.stderr
    q = json.loads(run_cli("--config", str(cfg), "queue", "--json").stdout)
    assert [x["id"] for x in q] == [ids[1]]
    assert q[0]["reason_code"] == "quota" and "holds 2 of its 2" in q[0]["reason"]
    text = run_cli("--config", str(cfg), "queue").stdout
    assert ids[1] in text and "holds 2 of its 2" in text
    out = run_cli("--config", str(cfg), "cancel", ids[1], ids[0]).stdout
    assert f"{ids[1]}: cancelled" in out and f"{ids[0]}: stopping" in out
    nodes = json.loads(run_cli("--config", str(cfg), "nodes", "--json").stdout)
    assert nodes[0]["free_gpus"] == 2 and nodes[0]["runs"] == [ids[0]]
    run_cli("--config", str(cfg), "scheduler", "--once")  # signals the cancelled run
    deadline = time.time() + 20
    while time.time() < deadline:
        run_cli("--config", str(cfg), "scheduler", "--once")
        st = json.loads(run_cli("--config", str(cfg), "status", ids[0], "--json").stdout)[0]
        if st["phase"] == "cancelled":
            break
        time.sleep(0.3)
    assert st["phase"] == "cancelled"


def test_queue_on_a_contended_cluster_explains_every_pending_run(tmp_path: Path) -> None:
    """Every pending run has a reason, and an ETA when what it waits for has max_runtime."""
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(nodes=[("node-a", 4)], projects={"p": (4, 0), "q": (4, 0)}))
    base = ("--config", str(cfg))
    submitted = []
    for project, gpus in [("p", 2), ("q", 2), ("p", 2), ("q", 4), ("p", 1)]:
        r = run_cli(
            *base,
            "submit",
            "--no-start",
            "-p",
            project,
            "-g",
            str(gpus),
            "--max-runtime",
            "10m",
            "--",
            "sleep",
            "60",
        )
        assert r.returncode == 0, r.stderr
        submitted.append(r.stdout.strip())
    try:
        assert run_cli(*base, "scheduler", "--once").returncode == 0
        queue = json.loads(run_cli(*base, "queue", "--json").stdout)
        assert len(queue) == 3  # two 2-GPU runs fill the node
        for run in queue:
            assert run["reason_code"] in ("no_capacity", "reserved", "quota"), run
            assert run["reason"] and run["eta"] is not None, run
        text = run_cli(*base, "queue").stdout
        assert all(run["id"] in text for run in queue)
    finally:
        run_cli(*base, "cancel", *submitted)
        run_cli(*base, "scheduler", "--once")  # sends the stop signals
    deadline = time.time() + 20
    while time.time() < deadline:
        states = json.loads(run_cli(*base, "status", "--json").stdout)
        if all(s["phase"] in ("cancelled", "succeeded", "failed") for s in states):
            break
        run_cli(*base, "scheduler", "--once")
        time.sleep(0.3)
    assert all(s["phase"] == "cancelled" for s in states), states
