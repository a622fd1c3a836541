"""The control loop with the fake backend (exact, fast) and the local backend (real processes):
admission before launch, rollback, reconcile after a crash, requeue, cancel."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.backends import LaunchRequest
from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import Phase, Run
from mlops_gpu.testing import config_yaml, make_spec


def fake_runtime(tmp_path: Path, gpus: int = 4, max_attempts: int = 3) -> Runtime:
    data = yaml.safe_load(config_yaml(nodes=[("node-a", gpus)]))
    data["backends"] = {
        "fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"], "duration_s": 1000}
    }
    data["retry"] = {"max_attempts": max_attempts}
    cfg = parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path)
    return Runtime(cfg)


def fake(rt: Runtime) -> FakeBackend:
    b = rt.backends["fake"]
    assert isinstance(b, FakeBackend)
    return b


def get(rt: Runtime, run: Run) -> Run:
    r = rt.store.get(run.id)
    assert r is not None
    return r


def test_admission_is_recorded_before_launch(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path)
    seen: list[Phase] = []
    b = fake(rt)
    orig = b.launch

    def spy(req: LaunchRequest) -> str:
        r = rt.store.get(req.run_id)
        assert r is not None and r.placement == req.placement
        seen.append(r.phase)
        return orig(req)

    b.launch = spy  # type: ignore[method-assign]
    run = rt.submit(make_spec(gpus=2))
    Controller(rt).tick()
    assert seen == [Phase.ADMITTED]
    assert get(rt, run).phase is Phase.RUNNING


def test_failed_launch_rolls_back_then_fails_after_max_attempts(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path, max_attempts=2)
    fake(rt).fail_launches = 5
    run = rt.submit(make_spec(gpus=2))
    ctl = Controller(rt)
    ctl.tick()
    r = get(rt, run)
    assert (r.phase, r.reason_code, r.placement) == (Phase.PENDING, "launch_failed", None)
    ctl.tick()
    r = get(rt, run)
    assert r.phase is Phase.FAILED and "launch on fake failed (2x)" in (r.reason or "")
    kinds = [e.kind for e in rt.store.events(run.id) if not e.kind.startswith("mlflow_")]
    assert kinds == [
        "submitted",
        "admitted",
        "launch_failed",
        "admitted",
        "launch_failed",
        "failed",
    ]


def test_reconcile_rolls_back_an_admission_that_never_launched(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path)
    run = rt.submit(make_spec(gpus=2))
    from mlops_gpu.controller.loop import build_snapshot
    from mlops_gpu.core import decide

    (adm,) = decide(build_snapshot(rt, [run], [], time.time())).admissions
    assert rt.store.admit(run.id, adm.placement)  # ... and the scheduler dies here
    assert Controller(rt).reconcile() == 1
    r = get(rt, run)
    assert r.phase is Phase.PENDING and fake(rt).launch_count == 0


def test_reconcile_adopts_a_job_launched_before_the_crash(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path)
    run = rt.submit(make_spec(gpus=2))
    ctl = Controller(rt)
    ctl.tick()
    handle = get(rt, run).handle
    assert handle is not None
    # Simulate a crash between launch and recording the handle.
    with rt.store.engine.begin() as conn:
        from mlops_gpu.state.schema import runs

        conn.execute(runs.update().where(runs.c.id == run.id).values(handle=None, phase="admitted"))
    Controller(rt).reconcile()
    r = get(rt, run)
    assert r.handle == handle and r.phase is Phase.STARTING
    assert fake(rt).launch_count == 1


@pytest.mark.parametrize(
    ("max_attempts", "final"),
    [(3, Phase.PENDING), (1, Phase.FAILED)],
    ids=["requeued", "retries-spent"],
)
def test_lost_job_requeues_under_the_retry_policy(
    tmp_path: Path, max_attempts: int, final: Phase
) -> None:
    rt = fake_runtime(tmp_path, max_attempts=max_attempts)
    run = rt.submit(make_spec(gpus=2))
    ctl = Controller(rt)
    ctl.tick()
    fake(rt).lose(get(rt, run).handle or "")
    ctl.tick()
    r = get(rt, run)
    if final is Phase.PENDING:
        # requeued as attempt 2, which waits out its backoff (10 s by default) first
        assert (r.attempt, r.phase, r.reason_code) == (2, Phase.PENDING, "backoff")
        assert r.not_before is not None and 9 < r.not_before - time.time() <= 10
        assert [e.kind for e in rt.store.events(run.id)].count("lost") == 1
    else:
        assert r.phase is Phase.FAILED and r.attempt == 1
    assert len(rt.store.usage()) == 1 and rt.store.usage()[0].outcome == "lost"


def test_a_run_lost_with_its_node_is_not_placed_on_that_node_again(tmp_path: Path) -> None:
    """The node dies between the tick's read of the nodes and its poll (Slurm marks a node down
    and fails its jobs in one step): the requeued run must not be placed on it again, where its
    job would wait for good (a Slurm job pinned to a down node stays pending)."""
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)]))
    data["backends"] = {
        "fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"], "duration_s": 1000}
    }
    data["retry"] = {"max_attempts": 3, "backoff_s": 0}
    rt = Runtime(parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path))
    run = rt.submit(make_spec(gpus=2))
    ctl = Controller(rt)
    ctl.tick()
    b = fake(rt)
    b.lose(get(rt, run).handle or "")
    polled = b.poll

    def node_dies(handles: Any) -> Any:
        b.nodes = [replace(n, schedulable=False, state_reason="down: test") for n in b.nodes]
        return polled(handles)

    b.poll = node_dies  # type: ignore[method-assign]
    ctl.tick()
    r = get(rt, run)
    assert (r.attempt, r.phase, r.placement) == (2, Phase.PENDING, None)
    assert b.launch_count == 1


def test_cancel_running_run_signals_and_ends_cancelled(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path)
    run = rt.submit(make_spec(gpus=2))
    ctl = Controller(rt)
    ctl.tick()
    assert rt.store.request_cancel(run.id) is Phase.RUNNING
    ctl.tick()  # signals
    ctl.tick()  # sees it ended
    r = get(rt, run)
    assert r.phase is Phase.CANCELLED
    assert fake(rt).jobs[r.handle or ""].signals == 1


def test_pending_reason_is_stored(tmp_path: Path) -> None:
    rt = fake_runtime(tmp_path)
    a = rt.submit(make_spec(gpus=4))
    b = rt.submit(make_spec(gpus=1))
    Controller(rt).tick()
    assert get(rt, a).phase is Phase.RUNNING
    r = get(rt, b)
    assert r.reason_code == "no_capacity" or r.reason_code == "quota"
    assert r.reason and "needs 1" in r.reason


def local_runtime(tmp_path: Path) -> Runtime:
    p = tmp_path / "mlops-gpu.yaml"
    p.write_text(config_yaml())
    return Runtime.load(p)


def run_until_done(rt: Runtime, ctl: Controller, runs: list[Run], timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ctl.tick()
        if all(get(rt, r).phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED) for r in runs):
            return
        time.sleep(0.05)
    raise AssertionError("runs did not finish")


def test_two_concurrent_2gpu_runs_get_disjoint_devices(tmp_path: Path) -> None:
    rt = local_runtime(tmp_path)
    code = (
        "import os,time; print(os.environ['CUDA_VISIBLE_DEVICES']); "
        "open(os.environ['MLOPS_GPU_RUN_ID'] + '.start', 'w'); time.sleep(1)"
    )
    import sys

    runs = [
        rt.submit(make_spec(gpus=2, command=(sys.executable, "-c", code), workdir=str(tmp_path)))
        for _ in range(2)
    ]
    ctl = Controller(rt)
    ctl.tick()
    assert {get(rt, r).phase for r in runs} == {Phase.RUNNING}  # both at once
    run_until_done(rt, ctl, runs)
    devices = []
    for r in runs:
        (out,) = [f for f in rt.backends["local"].log_files(r.id, 1) if f.name == "stdout.log"]
        devices.append(set(out.read_text().strip().split(",")))
        assert get(rt, r).phase is Phase.SUCCEEDED
    assert all(len(d) == 2 for d in devices)
    assert not devices[0] & devices[1]
    assert devices[0] | devices[1] == {"0", "1", "2", "3"}


def test_preemption_signals_then_requeues_as_next_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's preemption path on real processes: the run gets its checkpoint signal,
    saves a checkpoint within the grace, is requeued, and completes as attempt 2."""
    import sys

    from mlops_gpu.controller.mirror import Mirror
    from mlops_gpu.core import Decision, Preemption

    rt = local_runtime(tmp_path)
    code = """
import os, signal, sys, time, pathlib
ckpt = pathlib.Path(os.environ['MLOPS_GPU_CHECKPOINT_DIR']) / 'ckpt'
if ckpt.exists():
    print('resumed from', ckpt.read_text()); sys.exit(0)
def save(signum, frame):
    ckpt.write_text('step-7'); sys.exit(0)
signal.signal(signal.SIGUSR1, save)
pathlib.Path(os.environ['MLOPS_GPU_RUN_ID'] + '.up').touch()
time.sleep(60)
"""
    from mlops_gpu.model import CheckpointPolicy

    run = rt.submit(
        make_spec(
            gpus=2,
            command=(sys.executable, "-c", code),
            workdir=str(tmp_path),
            checkpoint=CheckpointPolicy("SIGUSR1", 10),
        )
    )
    ctl = Controller(rt)
    ctl.tick()
    deadline = time.time() + 10
    while not (tmp_path / f"{run.id}.up").exists():
        assert time.time() < deadline
        time.sleep(0.05)
    real_cycle = Mirror.cycle
    once = {"done": False}

    def preempting(self: Mirror, now: float, history: Any, spent: Any) -> Decision:
        if not once["done"] and self.active():
            once["done"] = True
            return Decision(
                preemptions=(Preemption(run.id, "make room for a test", "SIGUSR1", 10.0),)
            )
        return real_cycle(self, now, history, spent)

    monkeypatch.setattr(Mirror, "cycle", preempting)
    run_until_done(rt, ctl, [run])
    r = get(rt, run)
    assert (r.phase, r.attempt) == (Phase.SUCCEEDED, 2)
    kinds = [e.kind for e in rt.store.events(run.id)]
    assert kinds.count("preempting") == 1 and kinds.count("preempted") == 1
    out = [f for f in rt.backends["local"].log_files(run.id, 2) if f.name == "stdout.log"]
    assert out[0].read_text().strip() == "resumed from step-7"
    assert [u.outcome for u in rt.store.usage()] == ["preempted", "succeeded"]


def test_warm_hooks_run_and_a_failing_one_is_logged_once_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``Controller.warm`` calls each backend's optional ``warm``; a backend that cannot get
    ready is said once (again only after it recovered and failed anew), and the daemon goes on."""
    rt = fake_runtime(tmp_path)
    calls: list[str] = []
    fails = {"now": True}

    def hook() -> None:
        calls.append("warm")
        if fails["now"]:
            raise ConnectionError("no route to the API")

    fake(rt).warm = hook  # type: ignore[attr-defined]
    ctl = Controller(rt)
    with caplog.at_level("WARNING", logger="mlops_gpu"):
        ctl.warm()
        ctl.warm()
        assert calls == ["warm", "warm"]
        said = [r.getMessage() for r in caplog.records if "not ready" in r.getMessage()]
        assert said == ["backend fake is not ready: no route to the API"]
        fails["now"] = False
        ctl.warm()
        fails["now"] = True
        ctl.warm()
    said = [r.getMessage() for r in caplog.records if "not ready" in r.getMessage()]
    assert len(said) == 2
    run = rt.submit(make_spec(gpus=1))  # a tick still works
    ctl.tick()
    assert get(rt, run).phase in (Phase.STARTING, Phase.RUNNING)
