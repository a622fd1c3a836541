"""The Slurm backend against the repo's real Slurm cluster (``scripts/slurm.sh``: nodes sn1, sn2
with 8 a100 each, sn3, sn4 with 8 h100 each): disjoint devices, gangs on distinct nodes, GPU
types, rejection at submit, checkpoint-aware preemption, one quota domain across the local and
Slurm backends, a node going down, and a job that ends while the scheduler is stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.backends import JobState
from mlops_gpu.backends.slurm import SlurmBackend
from mlops_gpu.controller import Controller, Runtime, SubmitError
from mlops_gpu.model import (
    ACTIVE_PHASES,
    TERMINAL_PHASES,
    CheckpointPolicy,
    Phase,
    ResourceRequest,
    Run,
)
from mlops_gpu.testing import config_yaml

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PY = sys.executable


def scancel_all() -> None:
    subprocess.run(["scancel", "--user", _user()], capture_output=True, timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline:
        jobs = json.loads(subprocess.check_output(["squeue", "--json"], timeout=30))["jobs"]
        if not [j for j in jobs if j["job_state"] in ("RUNNING", "PENDING", "COMPLETING")]:
            return
        time.sleep(0.5)


def _user() -> str:
    import getpass

    return getpass.getuser()


@pytest.fixture(autouse=True)
def clean(slurm_conf: str) -> Iterator[None]:
    scancel_all()
    for node in ("sn1", "sn2", "sn3", "sn4"):
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                       capture_output=True, timeout=30)  # fmt: skip
    yield
    scancel_all()


def slurm_runtime(
    tmp_path: Path, slurm_conf: str, *, local_a100: int = 0, projects: Any = None, **extra: Any
) -> Runtime:
    data = yaml.safe_load(config_yaml(projects=projects or {"p": (32, 0)}))
    data["gpu_types"] = {"a100-80gb": {"price_per_hour": 2.5}, "h100-80gb": {"price_per_hour": 4}}
    data["backends"] = {
        "hpc": {"type": "slurm", "cluster": "test", "slurm_conf": slurm_conf, "inventory_s": 0,
                "gres_types": {"a100-80gb": "a100", "h100-80gb": "h100"}},
    }  # fmt: skip
    if local_a100:
        data["backends"]["local"] = {"type": "local", "nodes": [
            {"name": "virt", "gpu_type": "a100-80gb", "gpus": local_a100}]}  # fmt: skip
    for p in data["projects"].values():
        nominal = p["quotas"]["a100-80gb"]["nominal"]
        p["quotas"]["h100-80gb"] = {"nominal": nominal, "borrowing_limit": 0}
    data["telemetry"] = {"interval_s": 1}
    data["retry"] = {"max_attempts": 3, "backoff_s": 0}
    data.update(extra)
    path = tmp_path / "mlops-gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return Runtime.load(path)


def drive(
    rt: Runtime, ctl: Controller, done: Callable[[], bool], timeout: float = 90,
    each: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    deadline = time.time() + timeout
    while time.time() < deadline:
        ctl.tick()
        if each is not None:
            each()
        if done():
            return
        time.sleep(0.2)
    states = [(r.spec.name, r.phase.value, r.reason) for r in rt.store.list_runs()]
    raise AssertionError(f"timed out; runs: {states}")


def phase(rt: Runtime, run: Run) -> Phase:
    got = rt.store.get(run.id)
    assert got is not None
    return got.phase


def all_ended(rt: Runtime, runs: list[Run]) -> Callable[[], bool]:
    return lambda: all(phase(rt, r) in TERMINAL_PHASES for r in runs)


def stdout(rt: Runtime, run: Run, attempt: int = 1) -> str:
    (f,) = [x for x in rt.backends["hpc"].log_files(run.id, attempt) if x.name == "stdout.log"]
    return f.read_text()


SHOW = "echo node=$SLURMD_NODENAME devices=$CUDA_VISIBLE_DEVICES; sleep 3"


def test_inventory_reads_nodes_and_gpu_types(tmp_path: Path, slurm_conf: str) -> None:
    rt = slurm_runtime(tmp_path, slurm_conf)
    nodes = {n.name: n for n in rt.backends["hpc"].inventory()}
    assert {n: (x.gpu_type, x.capacity, x.schedulable) for n, x in nodes.items()} == {
        "sn1": ("a100-80gb", 8, True), "sn2": ("a100-80gb", 8, True),
        "sn3": ("h100-80gb", 8, True), "sn4": ("h100-80gb", 8, True),
    }  # fmt: skip


def test_two_runs_on_one_node_get_disjoint_devices_and_a_gang_spans_two_nodes(
    tmp_path: Path, slurm_conf: str
) -> None:
    rt = slurm_runtime(tmp_path, slurm_conf)
    pair = [rt.submit(rt.spec(("bash", "-c", SHOW), project="p",
                              request=ResourceRequest(gpus=2, gpu_types=("h100-80gb",))))
            for _ in range(2)]  # fmt: skip
    gang = rt.submit(
        rt.spec(
            ("bash", "-c", SHOW),
            project="p",
            request=ResourceRequest(gpus=1, nodes=2, gpu_types=("a100-80gb",)),
        )
    )
    ctl = Controller(rt)
    drive(rt, ctl, all_ended(rt, [*pair, gang]))
    assert {phase(rt, r) for r in [*pair, gang]} == {Phase.SUCCEEDED}
    seen = [dict(w.split("=", 1) for w in stdout(rt, r).split()) for r in pair]
    assert seen[0]["node"] == seen[1]["node"] and seen[0]["node"] in ("sn3", "sn4")
    devs = [set(s["devices"].split(",")) for s in seen]
    assert len(devs[0]) == len(devs[1]) == 2 and not devs[0] & devs[1]
    lines = stdout(rt, gang).split("\n")
    nodes = {dict(w.split("=", 1) for w in ln.split())["node"] for ln in lines if ln.strip()}
    assert len(nodes) == 2 and nodes <= {"sn1", "sn2"}


def test_gpu_types_and_rejection_at_submit(tmp_path: Path, slurm_conf: str) -> None:
    rt = slurm_runtime(tmp_path, slurm_conf)
    h = rt.submit(rt.spec(("bash", "-c", SHOW), project="p",
                          request=ResourceRequest(gpus=1, gpu_types=("h100-80gb",))))  # fmt: skip
    drive(rt, Controller(rt), all_ended(rt, [h]))
    assert dict(w.split("=", 1) for w in stdout(rt, h).split())["node"] in ("sn3", "sn4")
    with pytest.raises(SubmitError, match="16"):
        rt.submit(rt.spec(("true",), project="p", request=ResourceRequest(gpus=16)))


CHECKPOINTING = """
import os, signal, sys, time, pathlib
ckpt = pathlib.Path(os.environ["MLOPS_GPU_CHECKPOINT_DIR"]) / "state.txt"
if ckpt.exists():
    print("resumed from", ckpt.read_text(), flush=True)
    sys.exit(0)
def save(*_):
    ckpt.write_text("attempt " + os.environ["MLOPS_GPU_ATTEMPT"])
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
print("started", flush=True)
time.sleep(600)
"""


def test_preemption_checkpoints_requeues_and_completes_as_attempt_2(
    tmp_path: Path, slurm_conf: str
) -> None:
    rt = slurm_runtime(tmp_path, slurm_conf, policy={"order": "submit"})
    lows = [rt.submit(rt.spec((PY, "-c", CHECKPOINTING), priority="low", project="p",
                              request=ResourceRequest(gpus=8, gpu_types=("h100-80gb",)),
                              checkpoint=CheckpointPolicy(signal="SIGUSR1", grace_s=30)))
            for _ in range(2)]  # fmt: skip
    ctl = Controller(rt)
    drive(rt, ctl, lambda: all(phase(rt, r) is Phase.RUNNING for r in lows))
    time.sleep(2)  # the jobs are up and have set their handlers
    high = rt.submit(
        rt.spec(
            ("bash", "-c", "echo high; sleep 2"),
            priority="high",
            project="p",
            request=ResourceRequest(gpus=8, gpu_types=("h100-80gb",)),
        )
    )
    drive(rt, ctl, lambda: phase(rt, high) is Phase.SUCCEEDED, timeout=120)
    # one low run was preempted: it saved a checkpoint, was requeued, and resumed from it
    victims = [r for r in lows if (rt.store.get(r.id) or r).attempt == 2]
    assert len(victims) == 1
    (victim,) = victims
    kinds = [e.kind for e in rt.store.events(victim.id)]
    assert "preempting" in kinds and "preempted" in kinds
    drive(rt, ctl, lambda: phase(rt, victim) is Phase.SUCCEEDED, timeout=120)
    assert "resumed from attempt 1" in stdout(rt, victim, attempt=2)
    for r in lows:
        rt.store.request_cancel(r.id)
    drive(rt, ctl, all_ended(rt, lows))


def test_one_quota_domain_across_local_and_slurm(tmp_path: Path, slurm_conf: str) -> None:
    rt = slurm_runtime(tmp_path, slurm_conf, local_a100=8, projects={"p": (8, 0)})
    # half pinned to each backend, so both take part; the quota is the project's across both
    runs = [rt.submit(rt.spec(("bash", "-c", "sleep 2"), project="p",
                              backend=("local", "hpc")[i % 2],
                              request=ResourceRequest(gpus=2, gpu_types=("a100-80gb",))))
            for i in range(20)]  # fmt: skip
    held: list[float] = []
    backends: set[str] = set()

    def sample() -> None:
        active = rt.store.list_runs(ACTIVE_PHASES)
        held.append(sum(r.placement.gpu_amount for r in active if r.placement))
        backends.update(r.placement.backend for r in active if r.placement)

    drive(rt, Controller(rt), all_ended(rt, runs), timeout=240, each=sample)
    assert {phase(rt, r) for r in runs} == {Phase.SUCCEEDED}
    assert max(held) == 8 and backends == {"local", "hpc"}  # full, never over


def test_a_node_going_down_loses_the_run_and_requeues_it(tmp_path: Path, slurm_conf: str) -> None:
    rt = slurm_runtime(tmp_path, slurm_conf)
    run = rt.submit(
        rt.spec(
            ("sleep", "600"), project="p", request=ResourceRequest(gpus=1, gpu_types=("h100-80gb",))
        )
    )
    ctl = Controller(rt)
    drive(rt, ctl, lambda: phase(rt, run) is Phase.RUNNING)
    got = rt.store.get(run.id)
    assert got is not None and got.placement is not None
    node = got.placement.node_names[0]
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=test"],
                   check=True, capture_output=True, timeout=30)  # fmt: skip
    drive(rt, ctl, lambda: (rt.store.get(run.id) or run).attempt == 2)
    kinds = [e.kind for e in rt.store.events(run.id)]
    assert "lost" in kinds
    again = rt.store.get(run.id)
    assert again is not None and again.phase in (Phase.PENDING, *ACTIVE_PHASES)
    # (the node may already be back: the test cluster returns DOWN nodes to service when their
    # slurmd registers again, so where attempt 2 lands is not asserted)
    rt.store.request_cancel(run.id)
    drive(rt, ctl, all_ended(rt, [run]))


def test_a_job_pinned_to_a_drained_node_is_cancelled_and_reported_lost(
    tmp_path: Path, slurm_conf: str
) -> None:
    """A node that dies between the core's decision and the ``sbatch`` leaves the job pending
    (``ReqNodeNotAvail``) until an admin acts: the backend cancels it and reports it lost, so
    the run is requeued elsewhere; a job pinned to a usable node is left alone."""
    b = slurm_runtime(tmp_path, slurm_conf).backends["hpc"]
    assert isinstance(b, SlurmBackend)

    def sbatch(node: str, name: str) -> str:
        out = subprocess.check_output(
            ["sbatch", "--parsable", f"--job-name=mlops-gpu.{name}.1", f"--nodelist={node}",
             "--no-requeue", f"--output={tmp_path}/{name}.log", "--wrap", "sleep 30"],
            text=True, timeout=30,
        )  # fmt: skip
        return f"slurm:test:{out.strip().split(';')[0]}"

    drain = ["scontrol", "update", "nodename=sn4", "state=drain", "reason=test"]
    subprocess.run(drain, check=True, capture_output=True, timeout=30)
    try:
        stuck, fine = sbatch("sn4", "rstuck"), sbatch("sn1", "rfine")
        deadline = time.time() + 60
        while time.time() < deadline:  # squeue gives the reason at Slurm's next pass
            got = b.poll([stuck, fine])
            if got[stuck].state is JobState.LOST:
                break
            time.sleep(0.5)
        assert got[stuck].state is JobState.LOST, got
        assert "its node sn4 is unavailable (drain" in (got[stuck].reason or "")
        assert got[fine].state in (JobState.STARTING, JobState.RUNNING)
        queue = json.loads(subprocess.check_output(["squeue", "--json"], timeout=30))["jobs"]
        left = {str(j["job_id"]): j["job_state"] for j in queue}
        assert stuck.rsplit(":", 1)[1] not in left or "PENDING" not in str(
            left[stuck.rsplit(":", 1)[1]]
        )  # cancelled: it will not start when the node is resumed
    finally:
        subprocess.run(["scontrol", "update", "nodename=sn4", "state=resume"],
                       capture_output=True, timeout=30)  # fmt: skip


def test_a_job_that_ends_while_the_scheduler_is_stopped_is_recorded_as_ended(
    tmp_path: Path, slurm_conf: str
) -> None:
    rt = slurm_runtime(tmp_path, slurm_conf)
    run = rt.submit(rt.spec(("bash", "-c", "sleep 2; exit 3"), project="p",
                            request=ResourceRequest(gpus=1)))  # fmt: skip
    ctl = Controller(rt)
    drive(rt, ctl, lambda: phase(rt, run) is Phase.RUNNING)
    backend = rt.backends["hpc"]
    assert isinstance(backend, SlurmBackend)
    got = rt.store.get(run.id)
    assert got is not None and got.handle is not None
    job_id = got.handle.rsplit(":", 1)[1]
    # the scheduler is "down" until Slurm has forgotten the job (MinJobAge): only the
    # completion record knows how it ended
    deadline = time.time() + 180
    while subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                         timeout=30).returncode == 0:  # fmt: skip
        assert time.time() < deadline, "Slurm kept the job record"
        time.sleep(2)
    fresh = Runtime.load(rt.cfg.source)
    ctl2 = Controller(fresh)
    ctl2.reconcile()
    drive(fresh, ctl2, all_ended(fresh, [run]))
    ended = fresh.store.get(run.id)
    assert ended is not None and ended.phase is Phase.FAILED and ended.exit_code == 3
    assert "lost" not in [e.kind for e in fresh.store.events(run.id)]


def test_a_restarted_scheduler_finds_a_job_it_launched_but_never_recorded(
    tmp_path: Path, slurm_conf: str
) -> None:
    from mlops_gpu.backends import LaunchRequest
    from mlops_gpu.testing.builders import placed

    rt = slurm_runtime(tmp_path, slurm_conf)
    run = rt.submit(
        rt.spec(
            ("bash", "-c", "sleep 2"),
            project="p",
            request=ResourceRequest(gpus=1, gpu_types=("a100-80gb",)),
        )
    )
    where = placed("sn2", ["0"], backend="hpc")
    assert rt.store.admit(run.id, where)
    admitted = rt.store.get(run.id)
    assert admitted is not None
    # the crash: sbatch ran, the handle never reached the store
    handle = rt.backends["hpc"].launch(LaunchRequest(run.id, 1, admitted.spec, where))
    fresh = Runtime.load(rt.cfg.source)
    ctl = Controller(fresh)
    assert ctl.reconcile() == 1
    found = fresh.store.get(run.id)
    assert found is not None and found.handle == handle and found.phase is Phase.STARTING
    drive(fresh, ctl, all_ended(fresh, [run]))
    assert phase(fresh, run) is Phase.SUCCEEDED and len(rt.store.events(run.id)) > 3
