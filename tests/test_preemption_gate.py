"""Launch gating and lost work (issue 23, item 1), on the controller.

- A preemptor admitted on the devices its victims free stays ``admitted`` (holding them, with a
  reason naming the victims) until their jobs have exited, then launches; no device is used by
  two live jobs. This holds across a scheduler restart and a cancel of the waiting run.
- Each preemption records the GPU-seconds it throws away: in its ``preempting`` event, in
  ``status --events`` (table and JSON) and as ``mlops_gpu.lost_gpu_s`` on the preempted
  attempt's MLflow run.

The hand-made situations (a preemptor admitted by hand while its victim runs) stand for what
the core decides; ``test_a_preemptor_waits_for_its_victim_that_ignores_sigterm`` lets the core
decide it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import CheckpointPolicy, NodeSlot, Phase, Placement, ResourceRequest, Run
from mlops_gpu.testing import config_yaml, make_spec

#: A victim that ignores SIGTERM (killed after its grace), noting when it started.
STUBBORN = """
import os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(os.environ['MLOPS_GPU_RUN_ID'] + '.up').touch()
time.sleep(120)
"""
#: A short job.
QUICK = "import time; time.sleep(0.5)"


def local_runtime(tmp_path: Path) -> Runtime:
    p = tmp_path / "mlops-gpu.yaml"  # node-a: 4 virtual GPUs, project p; no MLflow (faster)
    p.write_text(config_yaml(extra={"mlflow": {"enabled": False}, "retry": {"backoff_s": 0.2}}))
    return Runtime.load(p)


def get(rt: Runtime, run: Run) -> Run:
    got = rt.store.get(run.id)
    assert got is not None
    return got


def wait_for(path: Path, timeout: float = 15) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def attempt_record(rt: Runtime, run_id: str, attempt: int) -> tuple[set[str], float, float]:
    """(devices, start, end) of an attempt, from the local supervisor's own files."""
    d = rt.cfg.state_path / "runs" / run_id / str(attempt)
    launch = json.loads((d / "launch.json").read_text())
    ended = json.loads((d / "exit.json").read_text())
    return set(launch["devices"]), ended["started_at"], ended["finished_at"]


def stubborn_victim(rt: Runtime, tmp_path: Path, **kw: object) -> Run:
    spec = make_spec(gpus=4, command=(sys.executable, "-c", STUBBORN), workdir=str(tmp_path),
                     checkpoint=CheckpointPolicy("SIGTERM", 2.0), **kw)  # fmt: skip
    return rt.submit(spec)


def preemptor_admitted_by_hand(rt: Runtime, tmp_path: Path, victim: Run) -> Run:
    """What the core decides when a run preempts ``victim``: the victim flagged, the preemptor
    admitted on its devices in the same decision."""
    quick = make_spec(gpus=4, command=(sys.executable, "-c", QUICK), workdir=str(tmp_path))
    pre = rt.submit(quick)
    v = get(rt, victim)
    assert v.placement is not None
    rt.store.mark_preempting(v.id, f"preempted for run {pre.id}")
    assert rt.store.admit(pre.id, v.placement)
    return pre


def test_a_waiting_preemptor_survives_a_restart_and_launches_after_its_victim_exits(
    tmp_path: Path,
) -> None:
    rt = local_runtime(tmp_path)
    victim = stubborn_victim(rt, tmp_path)
    first = Controller(rt)
    first.tick()
    wait_for(tmp_path / f"{victim.id}.up")
    pre = preemptor_admitted_by_hand(rt, tmp_path, victim)
    # the scheduler that decided it stopped before signalling anyone; a new one starts
    ctl = Controller(rt)
    ctl.reconcile()
    got = get(rt, pre)
    assert got.phase is Phase.ADMITTED and got.handle is None  # not rolled back, not launched
    ctl.tick()  # signals the victim (the old scheduler never did); it ignores SIGTERM
    got = get(rt, pre)
    assert got.phase is Phase.ADMITTED and got.handle is None
    assert got.placement == get(rt, victim).placement  # its devices stay held for it
    assert got.reason_code == "preempting"
    assert got.reason == f"waiting for preempted run(s) {victim.id} to exit (grace up to 2 s)"
    kinds = [e.kind for e in rt.store.events(pre.id)]
    assert kinds.count("waiting") == 1
    deadline = time.time() + 30
    while get(rt, pre).handle is None:
        assert time.time() < deadline, get(rt, pre)
        ctl.tick()
        assert get(rt, pre).handle is None or get(rt, victim).phase is Phase.PENDING
        time.sleep(0.1)
    assert get(rt, pre).reason is None  # the wait is over
    rt.store.request_cancel(victim.id)  # (requeued: it would wait for the GPUs)
    while get(rt, pre).phase is not Phase.SUCCEEDED:
        assert time.time() < deadline, get(rt, pre)
        ctl.tick()
        time.sleep(0.1)
    v_devices, _, v_end = attempt_record(rt, victim.id, 1)
    p_devices, p_start, _ = attempt_record(rt, pre.id, 1)
    assert v_devices == p_devices == {"0", "1", "2", "3"}
    assert p_start >= v_end  # not launched before its victim exited


def test_a_waiting_preemptor_cancelled_never_launches(tmp_path: Path) -> None:
    rt = local_runtime(tmp_path)
    victim = stubborn_victim(rt, tmp_path)
    ctl = Controller(rt)
    ctl.tick()
    wait_for(tmp_path / f"{victim.id}.up")
    pre = preemptor_admitted_by_hand(rt, tmp_path, victim)
    ctl = Controller(rt)  # (a restart: this one finds the waiting admission)
    ctl.reconcile()
    ctl.tick()
    assert get(rt, pre).phase is Phase.ADMITTED
    assert rt.store.request_cancel(pre.id) is Phase.ADMITTED  # flagged: it holds GPUs
    ctl.tick()
    got = get(rt, pre)
    assert got.phase is Phase.CANCELLED and got.handle is None
    assert not (rt.cfg.state_path / "runs" / pre.id).exists()  # never launched
    deadline = time.time() + 30
    while get(rt, victim).phase is not Phase.RUNNING or get(rt, victim).attempt < 2:
        assert time.time() < deadline, get(rt, victim)  # the victim, requeued, gets them back
        ctl.tick()
        time.sleep(0.1)
    rt.store.request_cancel(victim.id)
    while get(rt, victim).phase is not Phase.CANCELLED:
        assert time.time() < deadline
        ctl.tick()
        time.sleep(0.1)


def test_a_preemptor_waits_for_its_victim_that_ignores_sigterm(tmp_path: Path) -> None:
    """The core decides: a high-priority run preempts a normal one that ignores SIGTERM (2 s
    grace). The preemptor is admitted in that decision, holds the devices, launches only after
    the victim's process is gone, at the first tick after; no device serves two jobs."""
    rt = local_runtime(tmp_path)
    victim = stubborn_victim(rt, tmp_path)
    ctl = Controller(rt)
    ctl.tick()
    wait_for(tmp_path / f"{victim.id}.up")
    quick = make_spec(gpus=4, command=(sys.executable, "-c", QUICK), workdir=str(tmp_path),
                      priority="high")  # fmt: skip
    pre = rt.submit(quick)
    ctl.tick()
    v, p = get(rt, victim), get(rt, pre)
    assert v.preempt_requested and v.phase is Phase.RUNNING
    assert p.phase is Phase.ADMITTED and p.handle is None and p.placement == v.placement
    assert p.reason == f"waiting for preempted run(s) {victim.id} to exit (grace up to 2 s)"
    deadline = time.time() + 30
    exited_seen: float | None = None
    while get(rt, pre).handle is None:
        assert time.time() < deadline
        ctl.tick()
        if get(rt, victim).phase is Phase.PENDING and exited_seen is None:
            exited_seen = time.time()
            assert get(rt, pre).handle is not None  # launched in the tick that saw it exit
        time.sleep(0.1)
    rt.store.request_cancel(victim.id)
    while get(rt, pre).phase is not Phase.SUCCEEDED or get(rt, victim).phase is Phase.RUNNING:
        assert time.time() < deadline
        ctl.tick()
        time.sleep(0.1)
    v_devices, _, v_end = attempt_record(rt, victim.id, 1)
    p_devices, p_start, _ = attempt_record(rt, pre.id, 1)
    assert v_devices == p_devices and p_start >= v_end
    (ev,) = [e for e in rt.store.events(victim.id) if e.kind == "preempting"]
    assert ev.lost_gpu_s is not None and ev.lost_gpu_s > 0


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.mark.slow
@pytest.mark.parametrize("stopped", [False, True], ids=["closed", "closed-after-restart"])
def test_lost_work_is_in_the_event_status_and_mlflow(tmp_path: Path, stopped: bool) -> None:
    """A normal run on all 4 GPUs, checkpointed 40 s into its 100 s, is preempted by a high
    one: 4 GPUs x 60 s = 240 GPU-seconds lost, in the store's event, ``status --events`` (JSON
    and table) and the attempt's MLflow run (``mlops_gpu.lost_gpu_s``), also when the scheduler
    stopped before closing it (``stopped``: the next start closes it from the store)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    data = yaml.safe_load(config_yaml())
    data["backends"] = {"fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    data["mlflow"] = {"tracking_uri": uri}
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(yaml.safe_dump(data))
    clock = Clock()
    rt = Runtime(parse_config(data, str(cfg), tmp_path))
    rt.__dict__["backends"] = {"fake": FakeBackend("fake", rt.cfg.model_nodes("fake"), clock=clock)}
    long = {"FAKE_DURATION_S": "3600"}
    victim = rt.submit(rt.spec(("train",), project="p", request=ResourceRequest(gpus=4), env=long))
    ctl = Controller(rt, clock=clock)
    if stopped:  # no close is ever made by this scheduler
        ctl.tracking.put = lambda items: None  # type: ignore[method-assign]
    ctl.tick()
    assert get(rt, victim).phase is Phase.RUNNING
    clock.now += 40
    rt.store.record_checkpoint(victim.id, now=clock.now)
    clock.now += 60
    rt.submit(rt.spec(("eval",), project="p", priority="high", request=ResourceRequest(gpus=4)))
    for _ in range(3):  # preempt; see it stopped (requeued); start the preemptor
        ctl.tick()
    (ev,) = [e for e in rt.store.events(victim.id) if e.kind == "preempting"]
    assert ev.lost_gpu_s == pytest.approx(240.0)
    if stopped:
        ctl.release()
        ctl = Controller(rt, clock=clock)
        ctl.reconcile()  # (queues the closes the last one never made)
    assert ctl.drain_tracking()
    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(exps, f"tags.`mlops_gpu.run_id` = '{victim.id}'")
    (first,) = [r for r in found if r.data.tags["mlops_gpu.attempt"] == "1"]
    assert first.data.tags["mlops_gpu.outcome"] == "preempted"
    assert first.data.metrics["mlops_gpu.lost_gpu_s"] == pytest.approx(240.0)
    env = {"MLOPS_GPU_CONFIG": ""}
    r = run_cli("--config", str(cfg), "status", victim.id, "--events", "--json", env=env)
    assert r.returncode == 0, r.stderr
    (shown,) = json.loads(r.stdout)
    lost = {e["kind"]: e["lost_gpu_s"] for e in shown["events"]}
    assert lost["preempting"] == 240.0 and lost["submitted"] is None
    r = run_cli("--config", str(cfg), "status", victim.id, "--events", env=env)
    assert r.returncode == 0, r.stderr
    assert "LOST GPU-S" in r.stdout
    (row,) = [line for line in r.stdout.splitlines() if "preempting" in line]
    assert "240" in row


def test_a_store_from_before_lost_work_gains_the_column(tmp_path: Path) -> None:
    """Migration v7 adds ``events.lost_gpu_s`` to an older store; its events read with None."""
    from sqlalchemy import select, text

    from mlops_gpu.state import Store
    from mlops_gpu.state.migrations import LATEST
    from mlops_gpu.state.schema import schema_version

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Store(url)
    run = old.submit(make_spec(gpus=1))
    with old.engine.begin() as conn:  # the store as v6 left it
        conn.execute(text("ALTER TABLE events DROP COLUMN lost_gpu_s"))
        conn.execute(schema_version.update().values(version=6))
    old.close()
    new = Store(url)
    try:
        assert [(e.kind, e.lost_gpu_s) for e in new.events(run.id)] == [("submitted", None)]
        assert new.admit(run.id, _one_gpu())
        new.mark_running(run.id)
        new.mark_preempting(run.id, "make room", lost_gpu_s=12.5)
        assert new.events(run.id)[-1].lost_gpu_s == 12.5
        with new.engine.connect() as conn:
            assert conn.execute(select(schema_version.c.version)).all() == [(LATEST,)]
    finally:
        new.close()


def _one_gpu() -> Placement:
    return Placement("local", "a100-80gb", (NodeSlot("node-a", ("0",)),))


def test_blockers_are_jobs_on_its_devices_being_preempted_or_holding_them_whole() -> None:
    """Whole devices: any job on them blocks. Shared devices: only a job being preempted (the
    core counts its share as gone); a job sharing them otherwise is the core's own sharing. A
    run without a job (another admission waiting) never blocks."""
    from mlops_gpu.controller import gate
    from mlops_gpu.testing.builders import make_run, placed

    def job(rid: str, devices: list[str], fraction: float = 1.0, **kw: object) -> Run:
        p = placed("node-a", devices, fraction=fraction)
        return make_run(rid, phase=Phase.RUNNING, placement=p, handle=f"h-{rid}", **kw)

    me = make_run("me", phase=Phase.ADMITTED, placement=placed("node-a", ["0", "1"]))
    others = [job("v", ["1", "2"], preempt_requested=True), job("w", ["3"])]
    assert [r.id for r in gate.blockers(me, others, gate.going_ids(others))] == ["v"]
    whole = [job("x", ["0"])]  # (never the core's doing; still no double use)
    assert [r.id for r in gate.blockers(me, whole, set())] == ["x"]
    waiting = make_run("y", phase=Phase.ADMITTED, placement=placed("node-a", ["0"]))
    assert gate.blockers(me, [waiting], {"y"}) == []
    elsewhere = make_run("z", phase=Phase.RUNNING, placement=placed("node-b", ["0"]), handle="h")
    assert gate.blockers(me, [elsewhere], {"z"}) == []
    half = make_run("me", phase=Phase.ADMITTED, placement=placed("node-a", ["0"], fraction=0.5))
    sharer = [job("s", ["0"], fraction=0.5)]
    assert gate.blockers(half, sharer, set()) == []
    assert [r.id for r in gate.blockers(half, sharer, {"s"})] == ["s"]  # (flagged this tick)
    assert gate.waiting_reason(others[:1]) == (
        "waiting for preempted run(s) v to exit (grace up to 30 s)"
    )
