"""Elastic pools on a real Slurm cluster with power saving: ``scripts/slurm.sh`` with
``MLOPS_GPU_SLURM_CLOUD=4`` (cloud nodes sc1..sc4, 4 l4 GPUs each, powered down at start; their
ResumeProgram starts the node's slurmd after 3 s, their SuspendProgram stops it after 15 s idle).
A cluster of its own (state directory and ports), so the shared test cluster is left alone.

- A burst of 16 one-GPU runs on a pool at 0 powered-up nodes: the scheduler boots nodes for
  them (the queue says which and when), Slurm resumes them, every run finishes exactly once,
  and the pool goes back to 0 powered-up nodes after ``SuspendTime``.
- A node whose ResumeProgram fails: Slurm marks it down at ``ResumeTimeout``; its runs are
  requeued onto another node, nothing lost, each run done exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import run_cli, start_service

from mlops_gpu.backends.slurm import SlurmBackend
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import TERMINAL_PHASES, NodeState, Phase, ResourceRequest, Run
from mlops_gpu.testing import config_yaml

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CLOUD = ("sc1", "sc2", "sc3", "sc4")
#: the cloud cluster's own state directory and slurmctld port (nodes on the ports above it)
CLOUD_DIR = os.environ.get(
    "MLOPS_GPU_TEST_SLURM_CLOUD_DIR",
    str(Path(os.environ.get("HOME", "/tmp")) / ".cache" / "mlops-gpu" / "slurm-cloud"),
)
CLOUD_PORT = os.environ.get("MLOPS_GPU_TEST_SLURM_CLOUD_PORT", "17840")
SUSPEND_S = 15


@pytest.fixture(scope="module")
def cloud_conf() -> Iterator[str]:
    env = {"MLOPS_GPU_SLURM_DIR": CLOUD_DIR, "MLOPS_GPU_SLURM_PORT": CLOUD_PORT,
           "MLOPS_GPU_SLURM_CLOUD": "4", "MLOPS_GPU_SLURM_BOOT_S": "3",
           "MLOPS_GPU_SLURM_SUSPEND_S": str(SUSPEND_S)}  # fmt: skip
    old = {k: os.environ.get(k) for k in [*env, "SLURM_CONF"]}
    os.environ.update(env)  # (start_service runs scripts/slurm.sh with our environment)
    try:
        # from scratch: node states saved by an earlier run (a node left up or down) would stand
        stop(purge=True)
        conf = start_service("slurm.sh", "Slurm", "MLOPS_GPU_REQUIRE_SLURM", 900, key="SLURM_CONF")
        os.environ["SLURM_CONF"] = conf  # for the tests' own sinfo/scontrol calls
        yield conf
    finally:
        stop(purge=False)  # (its logs stay for a look after a failure)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stop(purge: bool) -> None:
    subprocess.run(["bash", "scripts/slurm.sh", "stop", *(["--purge"] if purge else [])],
                   cwd=Path(__file__).parents[2], capture_output=True, timeout=300)  # fmt: skip


def states() -> dict[str, str]:
    """Slurm's compact state of each cloud node (``idle~``, ``mix#``, ``down~``, ...)."""
    out = subprocess.check_output(["sinfo", "-h", "-N", "-o", "%N %t"], text=True, timeout=30)
    return {n: s for n, s in (ln.split() for ln in out.splitlines()) if n in CLOUD}


def wait_for(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if done():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; nodes: {states()}")


@pytest.fixture
def powered_down(cloud_conf: str) -> Iterator[None]:
    """Every cloud node powered down and usable before the test; no resume made to fail."""
    marks = Path(CLOUD_DIR) / "resume-fail"
    for f in marks.glob("*"):
        f.unlink()
    subprocess.run(["scancel", "--partition=gpu"], capture_output=True, timeout=30)
    for n, s in states().items():
        if s.startswith(("down", "drain")):
            subprocess.run(["scontrol", "update", f"nodename={n}", "state=resume"],
                           capture_output=True, timeout=30)  # fmt: skip
    wait_for("the pool at 0 nodes", lambda: all(s == "idle~" for s in states().values()), 120)
    yield
    for f in marks.glob("*"):
        f.unlink()


def pool_runtime(tmp_path: Path, conf: str) -> Runtime:
    data = yaml.safe_load(config_yaml(projects={"p": (32, 0)}))
    data["gpu_types"] = {"l4": {"price_per_hour": 1}}
    data["backends"] = {
        "cloud": {"type": "slurm", "cluster": "cloud", "slurm_conf": conf, "inventory_s": 0,
                  "gres_types": {"l4": "l4"}},
    }  # fmt: skip
    data["projects"]["p"]["quotas"] = {"l4": {"nominal": 32, "borrowing_limit": 0}}
    data["pools"] = {
        "burst": {"backend": "cloud", "gpu_type": "l4", "gpus_per_node": 4, "min_nodes": 0,
                  "max_nodes": 4, "boot_s": 5, "price_per_node_hour": 1, "idle_s": SUSPEND_S},
    }  # fmt: skip
    data["telemetry"] = {"interval_s": 1}
    data["retry"] = {"max_attempts": 3, "backoff_s": 0}
    path = tmp_path / "mlops-gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return Runtime.load(path)


def burst(rt: Runtime, tmp_path: Path, n: int) -> list[Run]:
    """``n`` one-GPU runs that each append their id to ``ran.txt`` (so a second execution of a
    run would show) and take 2 s."""
    cmd = f'echo "$MLOPS_GPU_RUN_ID" >> {tmp_path}/ran.txt; sleep 2'
    spec = rt.spec(("bash", "-c", cmd), project="p", request=ResourceRequest(gpus=1))
    return [rt.submit(spec) for _ in range(n)]


def drive(rt: Runtime, ctl: Controller, runs: list[Run], timeout: float) -> list[Run]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ctl.tick()
        got = [rt.store.get(r.id) for r in runs]
        if all(g is not None and g.phase in TERMINAL_PHASES for g in got):
            return [g for g in got if g is not None]
        time.sleep(0.3)
    queue = subprocess.run(["squeue", "-h", "-o", "%i %j %T %r %n"], capture_output=True,
                           text=True, timeout=30).stdout  # fmt: skip
    raise AssertionError(
        f"timed out; runs: {[(g.phase, g.attempt, g.reason) for g in got if g]}; nodes: "
        f"{states()}; squeue: {queue.splitlines()}"
    )


def ran_once(tmp_path: Path, runs: list[Run]) -> None:
    ran = Counter((tmp_path / "ran.txt").read_text().split())
    assert ran == Counter({r.id: 1 for r in runs})


def test_a_burst_boots_the_pool_from_zero_and_it_goes_back_to_zero(
    tmp_path: Path, cloud_conf: str, powered_down: None
) -> None:
    rt = pool_runtime(tmp_path, cloud_conf)
    backend = rt.backends["cloud"]
    assert isinstance(backend, SlurmBackend)
    runs = burst(rt, tmp_path, 16)
    ctl = Controller(rt)
    ctl.tick()  # no node is up: the pool decides to boot, and the queue says so
    reasons = [(rt.store.get(r.id) or r).reason for r in runs]
    assert all(x is not None and x.startswith("waiting for node sc") for x in reasons), reasons
    assert "to boot (ETA 1 min)" in str(reasons[0])
    out = run_cli("queue", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "waiting for node sc" in out.stdout
    done = drive(rt, ctl, runs, timeout=150)
    assert [g.phase for g in done] == [Phase.SUCCEEDED] * 16
    assert {g.attempt for g in done} == {1}
    used = {s.node for g in done if g.placement for s in g.placement.slots}
    assert used == set(CLOUD)  # 16 one-GPU runs packed onto the 4 nodes of 4 GPUs
    ran_once(tmp_path, runs)
    # Slurm suspends the idle nodes after SuspendTime: the pool is back at 0
    wait_for("the pool back at 0", lambda: all(s == "idle~" for s in states().values()),
             SUSPEND_S + 60)  # fmt: skip
    backend.inventory()
    assert set(backend.power_states().values()) == {NodeState.POWERED_DOWN}
    log = (Path(CLOUD_DIR) / "log" / "power.log").read_text()
    for n in CLOUD:
        assert f"suspend {n}: stopped slurmd" in log


def test_a_node_that_fails_to_resume_has_its_runs_requeued_elsewhere(
    tmp_path: Path, cloud_conf: str, powered_down: None
) -> None:
    (Path(CLOUD_DIR) / "resume-fail" / "sc1").touch()  # the pool boots sc1 first (name order)
    rt = pool_runtime(tmp_path, cloud_conf)
    runs = burst(rt, tmp_path, 4)
    ctl = Controller(rt)
    ctl.tick()
    assert all(((rt.store.get(r.id) or r).reason or "").startswith("waiting for node sc1 to boot")
               for r in runs)  # fmt: skip
    done = drive(rt, ctl, runs, timeout=300)  # ResumeTimeout, then a requeue
    assert [g.phase for g in done] == [Phase.SUCCEEDED] * 4
    assert {g.attempt for g in done} == {2}  # lost with sc1, requeued once
    used = {s.node for g in done if g.placement for s in g.placement.slots}
    assert used and "sc1" not in used
    ran_once(tmp_path, runs)
    assert states()["sc1"].startswith("down")
    events = json.dumps([e for r in runs for e in rt.store.events(r.id)], default=str)
    assert "failed" in events or "lost" in events
