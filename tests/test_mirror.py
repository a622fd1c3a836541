"""The controller's ``Mirror`` (change feed + the engine it keeps) against ``decide``:
over random submits, cancels, completions, preemptions and a node change, every tick's decision
equals ``decide`` on the snapshot of the same moment, and the mirror ends holding exactly the
store's live runs; with the Python reference engine, and with the native one where the install
built it (which the mirror then takes for every live run, CPU-only runs and runs on a node
the config no longer has included); and
without the Rust engine it says once what running the Python engine costs."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.controller.loop import template
from mlops_gpu.controller.mirror import Mirror
from mlops_gpu.core import Decision, decide
from mlops_gpu.engines import native
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import ResourceRequest
from mlops_gpu.testing import config_yaml


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def runtime(tmp_path: Path, clock: Clock) -> Runtime:
    data = yaml.safe_load(
        config_yaml(nodes=[("node-a", 4), ("node-b", 4)], projects={"p": (4, None), "q": (4, 2)})
    )
    data["backends"] = {"fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    data["retry"] = {"max_attempts": 5, "backoff_s": 0}
    rt = Runtime(parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path))
    nodes = rt.cfg.model_nodes("fake")
    rt.__dict__["backends"] = {"fake": FakeBackend("fake", nodes, clock=clock)}
    return rt


@pytest.fixture(params=["python", "native"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which engine the mirror should take: the installed Rust one, or Python (as installed
    without cargo)."""
    if request.param == "python":
        request.getfixturevalue("without_native")
    else:
        request.getfixturevalue("native_module")
    return str(request.param)


def checked_against_decide(monkeypatch: pytest.MonkeyPatch, rt: Runtime) -> list[Decision]:
    """Every ``Mirror.cycle`` from now on must admit and preempt as ``decide`` from scratch on
    the snapshot of the same moment; the list it returns fills with the decisions checked."""
    checked: list[Decision] = []
    real = Mirror.cycle

    def checking(self: Mirror, now: float, history: Any, spent: Any) -> Decision:
        snap = replace(
            template(rt, now),
            pending=tuple(self.pending()),
            active=tuple(self.active()),
            usage_history=history,
            spent=spent,
            anchor=self.kept_anchor(),  # (what the engine remembers: issue 24)
        )
        want = decide(snap, explain=False)
        got = real(self, now, history, spent)
        assert (got.admissions, got.preemptions) == (want.admissions, want.preemptions)
        checked.append(got)
        return got

    monkeypatch.setattr(Mirror, "cycle", checking)
    return checked


@pytest.mark.parametrize("seed", range(4))
def test_mirror_decides_as_the_core_does_from_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, engine: str
) -> None:
    rng = random.Random(seed)
    clock = Clock()
    rt = runtime(tmp_path, clock)
    checked = checked_against_decide(monkeypatch, rt)
    ctl = Controller(rt, clock=clock)
    for step in range(40):
        for _ in range(rng.randint(0, 3)):
            spec = rt.spec(
                ("train",),
                project=rng.choice("pq"),
                priority=rng.choice(["low", "normal", "high"]),
                request=ResourceRequest(gpus=rng.choice([1, 1, 2, 4])),
                max_runtime_s=rng.choice([None, 60.0, 600.0]),
                env={"FAKE_DURATION_S": str(rng.randint(5, 60))},
            )
            rt.submit(spec)
        if rng.random() < 0.2:
            live = rt.store.live_runs()[0]
            if live:
                rt.store.request_cancel(rng.choice(live).id)
        if step == 20:  # a node leaves: the engine is rebuilt around the same runs
            fake = rt.backends["fake"]
            assert isinstance(fake, FakeBackend)
            fake.nodes = fake.nodes[:1]
        clock.now += rng.uniform(1, 20)
        ctl.tick()
        kind = FromScratch if engine == "python" else native.NativeEngine
        assert isinstance(ctl.mirror.engine, kind)
    assert any(d.admissions for d in checked) and any(d.preemptions for d in checked)
    ctl.mirror.refresh(template(rt, clock()))  # the last tick's own writes
    live, _ = rt.store.live_runs()

    def unexplained(runs: Any) -> dict[str, Any]:  # reasons are not changes (the feed skips them)
        return {r.id: replace(r, reason_code=None, reason=None, eta=None) for r in runs}

    assert unexplained(live) == unexplained(ctl.mirror.runs.values())
    engine = ctl.mirror.engine
    assert engine is not None
    assert set(engine.pending) == {r.id for r in live if r.phase.value == "pending"}
    assert set(engine.active) == {r.id for r in live if r.placement is not None}


def test_a_run_on_a_node_that_left_keeps_the_native_engine_serving(
    tmp_path: Path, native_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An active run whose node left the inventory (a k8s node deleted, a Slurm node dropped
    from the config): the native engine takes it as the Python core does (``core.held``: its
    quota stays held, no node's devices), and keeps deciding as ``decide`` from scratch."""
    clock = Clock()
    rt = runtime(tmp_path, clock)
    checked = checked_against_decide(monkeypatch, rt)
    ctl = Controller(rt, clock=clock)
    long = {"FAKE_DURATION_S": "10000"}
    for project in "pq":
        rt.submit(rt.spec(("train",), project=project, request=ResourceRequest(gpus=4), env=long))
    ctl.tick()
    held = {r.id: r for r in rt.store.live_runs()[0] if r.placement is not None}
    assert len(held) == 2
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    gone = next(iter(held.values()))
    assert gone.placement is not None
    fake.nodes = tuple(n for n in fake.nodes if n.name != gone.placement.slots[0].node)
    for project in "pq":  # runs that want what the gone run held
        rt.submit(rt.spec(("train",), project=project, request=ResourceRequest(gpus=2)))
    for _ in range(3):
        clock.now += 5
        ctl.tick()
        engine = ctl.mirror.engine
        assert isinstance(engine, native.NativeEngine)
        assert set(held) <= set(engine.active)
    assert engine.used[(gone.project, gone.placement.gpu_type)] >= 4.0  # still its quota
    assert checked


def test_without_the_rust_engine_the_scheduler_says_once_what_python_costs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    without_native: None,
) -> None:
    from mlops_gpu.controller import mirror as mirror_mod

    monkeypatch.setattr(mirror_mod, "_warned", False)  # (another test may have logged it)
    clock = Clock()
    rt = runtime(tmp_path, clock)
    with caplog.at_level("WARNING", logger="mlops_gpu"):
        for _ in range(2):  # a restarted controller in the same process: still once
            ctl = Controller(rt, clock=clock)
            rt.submit(rt.spec(("train",), project="p", request=ResourceRequest(gpus=1)))
            ctl.tick()
            clock.now += 5
            ctl.mirror.reset()  # a rebuild of the engine
            ctl.tick()
            assert isinstance(ctl.mirror.engine, FromScratch)
    said = [r.getMessage() for r in caplog.records if "Rust engine" in r.getMessage()]
    assert said == [native.PYTHON_ENGINE_WARNING]
    assert "about 45 admissions/s instead of about 11,000" in said[0] and "cargo" in said[0]
