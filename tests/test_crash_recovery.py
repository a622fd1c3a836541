"""Kill the scheduler daemon with SIGKILL while runs run, restart it, and check that every run
ends in exactly one terminal phase, none was launched twice and no GPU was double-booked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from itertools import combinations, pairwise
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from mlops_gpu.config import load_config
from mlops_gpu.model import TERMINAL_PHASES, Phase
from mlops_gpu.state import Store
from mlops_gpu.testing import config_yaml

JOB = """
import os, sys, time
path, rid = sys.argv[1], os.environ['MLOPS_GPU_RUN_ID']
dev = os.environ['CUDA_VISIBLE_DEVICES']
with open(path, 'a') as f:
    f.write(f"start {rid} {os.environ['MLOPS_GPU_ATTEMPT']} {dev} {time.time()}\\n")
time.sleep(float(sys.argv[2]))
with open(path, 'a') as f:
    f.write(f"end {rid} {os.environ['MLOPS_GPU_ATTEMPT']} {dev} {time.time()}\\n")
"""


def start_scheduler(cfg: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(cfg), "scheduler"],
        stdout=subprocess.DEVNULL,
        stderr=open(cfg.parent / "sched.log", "ab"),
        start_new_session=True,
    )


@pytest.mark.slow
def test_sigkill_scheduler_midway_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)], projects={"p": (4, 0)}))
    data["scheduler"] = {"tick_s": 0.1}
    cfg.write_text(yaml.safe_dump(data))
    (tmp_path / "job.py").write_text(JOB)
    trace = tmp_path / "trace.txt"
    ids = []
    for i in range(10):
        r = run_cli(
            "--config",
            str(cfg),
            "submit",
            "--no-start",
            "-p",
            "p",
            "-g",
            "2",
            "--",
            sys.executable,
            str(tmp_path / "job.py"),
            str(trace),
            str(0.6 + 0.15 * (i % 4)),
        )
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip())

    store = Store(load_config(cfg).store_url)
    sched = start_scheduler(cfg)
    live = [Phase.RUNNING, Phase.STARTING, Phase.ADMITTED]
    for delay in (0.3, 0.0, 0.4):  # kill it three times, at different moments
        # A (re)started scheduler admits within a second on a quick machine, but a slow one
        # can take longer to import and start: wait for it to hold runs, then kill.
        started = time.time()
        while not store.list_runs(live) and time.time() - started < 30:
            assert sched.poll() is None, "scheduler died on its own"
            time.sleep(0.05)
        time.sleep(delay)
        assert sched.poll() is None, "scheduler died on its own"
        running = [r for r in store.list_runs(live)]
        os.killpg(sched.pid, signal.SIGKILL)  # its process group only: runs have their own
        sched.wait()
        assert running, "the kill should land while runs are active"
        sched = start_scheduler(cfg)
    deadline = time.time() + 60
    while time.time() < deadline:
        runs = [store.get(i) for i in ids]
        if all(r is not None and r.phase in TERMINAL_PHASES for r in runs):
            break
        time.sleep(0.2)

    # MLflow closes run beside scheduling (a stop does not wait for them: the next start makes
    # what is left): wait for the last scheduler to make them
    def unclosed() -> list[str]:
        return [f"{rid}:{m.attempt}" for rid in ids for m in store.mlflow_links(rid)
                if m.closed_at is None]  # fmt: skip

    while unclosed() and time.time() < deadline + 120:
        time.sleep(0.5)
    os.killpg(sched.pid, signal.SIGTERM)
    sched.wait(timeout=10)

    runs = [store.get(i) for i in ids]
    assert all(r is not None and r.phase is Phase.SUCCEEDED for r in runs), [
        (r.id, r.phase, r.reason) for r in runs if r
    ]
    # exactly one terminal event per run, and a phase chain without forks
    for rid in ids:
        evs = [e for e in store.events(rid) if e.phase_to is not None]
        assert sum(e.phase_to in {p.value for p in TERMINAL_PHASES} for e in evs) == 1
        for prev, nxt in pairwise(evs):
            assert prev.phase_to == nxt.phase_from
    # none launched twice: one start and one end line per run, all attempt 1
    lines = [ln.split() for ln in trace.read_text().splitlines()]
    starts = [ln for ln in lines if ln[0] == "start"]
    assert sorted(ln[1] for ln in starts) == sorted(ids)
    assert all(ln[2] == "1" for ln in starts)
    # every attempt's MLflow run is closed, also those whose close a kill cut off (queued,
    # not yet made): the next start closes them from the store's ledger
    from mlflow.tracking import MlflowClient

    client = MlflowClient(load_config(cfg).tracking_uri(dict(os.environ)))
    for rid in ids:
        noted = store.mlflow_links(rid)
        assert noted and all(m.closed_at is not None for m in noted), (rid, noted)
        made = [m.mlflow_run_id for m in noted if m.mlflow_run_id is not None]
        last = client.get_run(made[-1])
        assert last.info.status == "FINISHED", (rid, last.info.status)
        assert last.data.tags["mlops_gpu.outcome"] == "succeeded"
    # no GPU double-booked: overlapping runs hold disjoint devices (one node)
    spans = {}
    for kind, rid, _att, dev, t in lines:
        s = spans.setdefault(rid, {"dev": set(dev.split(","))})
        s[kind] = float(t)
    for a, b in combinations(spans.values(), 2):
        if a["start"] < b["end"] and b["start"] < a["end"]:
            assert not a["dev"] & b["dev"], (a, b)
