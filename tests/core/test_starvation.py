"""Issue 24 item 1: a whole-node run behind a steady stream of small short runs of its own
project starts as soon as the runs holding its GPUs and its quota when it was first refused
have ended (``tests/core/starvation.py``), in the issue's four variants: holders without
max_runtime, an anchor with a longer max_runtime than the stream under ``shortest``, quota equal
to the node (as ``mlops-gpu init`` writes it), and ``las``. Each on the reference engine
(``FromScratch``)."""

from __future__ import annotations

from typing import Any

import pytest

from mlops_gpu.core import Decision, ReasonCode, decide
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import Quota, Run
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from tests.core.starvation import drive

ENGINES = {"from-scratch": FromScratch}  # (the native engine's own suites compare it with this)


def _template(order: str, nominal: int) -> Any:
    # nominal 4 == the node, no cohort, no borrowing: what ``mlops-gpu init`` writes
    project = make_project("default", quotas={"a100-80gb": Quota(nominal, 0)})
    return make_snapshot([make_node("n1", 4)], [project], now=0.0, order=order)


def _scenario(max_runtime: float | None, target_max_runtime: float | None) -> tuple[Any, ...]:
    holders = [
        (make_run(f"h{i}", "default", seq=i, max_runtime_s=max_runtime), 2.0 + i % 3)
        for i in range(4)
    ]
    target = make_run(
        "big", "default", gpus=4, seq=10, submitted_at=0.0, max_runtime_s=target_max_runtime
    )

    def arrivals(step: int, now: float) -> list[tuple[Run, float]]:
        r = make_run(
            f"s{step}", "default", seq=100 + step, submitted_at=now, max_runtime_s=max_runtime
        )
        return [(r, 2.0 + step % 3)]

    return holders, target, arrivals


VARIANTS = {
    # holders and stream without max_runtime: today "no ETA", no reservation
    "no-max-runtime": ("shortest", 8, None, None),
    # under shortest the reservation went to a short run, not to the oldest blocked one
    "longer-max-runtime-shortest": ("shortest", 8, 5.0, 100.0),
    # blocked by its own project's quota: only capacity-blocked runs got a reservation
    "quota-equals-node": ("submit", 4, 5.0, 60.0),
    "las": ("las", 8, None, None),
    "las-quota-equals-node": ("las", 4, None, 60.0),
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_whole_node_run_is_not_starved(variant: str, engine: str) -> None:
    order, nominal, mr, target_mr = VARIANTS[variant]
    holders, target, arrivals = _scenario(mr, target_mr)
    out = drive(ENGINES[engine](_template(order, nominal)), holders, target, arrivals)
    assert out.started is not None, f"never started; {out.overtaken} later runs went first"
    assert out.bound is not None and out.started <= out.bound, out


def test_anchor_is_the_oldest_blocked_run_under_shortest() -> None:
    """S1: under ``shortest`` the reservation goes to the oldest blocked run, not to the head
    of the order (here a shorter 2-GPU run, which a 1-GPU run could backfill around); a later
    short run that would not end before it waits (RESERVED)."""
    holders = [
        make_run(f"h{i}", "default", seq=i, phase=_R, placement=_on(i), max_runtime_s=50.0)
        for i in range(3)
    ]
    snap = make_snapshot(
        [make_node("n1", 4)],
        [make_project("default", quotas={"a100-80gb": Quota(8, 0)})],
        [
            make_run("big", "default", gpus=4, seq=10, max_runtime_s=1000.0),
            make_run("medium", "default", gpus=2, seq=11, submitted_at=5.0, max_runtime_s=60.0),
            make_run("tiny", "default", seq=12, submitted_at=6.0, max_runtime_s=100.0),
        ],
        holders,
        now=10.0,
    )
    d = decide(snap)
    assert d.admissions == ()
    reasons = {p.run_id: p for p in d.pending}
    assert reasons["big"].eta == 50.0
    assert reasons["tiny"].reason_code is ReasonCode.RESERVED
    assert "held for run big" in reasons["tiny"].reason


def test_unknown_end_reservation_says_why() -> None:
    """S2: holders without max_runtime: the reservation exists with an unknown time, its reason
    names them, and a later run without max_runtime does not take the free GPU."""
    holders = [make_run(f"h{i}", "default", seq=i, phase=_R, placement=_on(i)) for i in range(3)]
    snap = make_snapshot(
        [make_node("n1", 4)],
        [make_project("default", quotas={"a100-80gb": Quota(8, 0)})],
        [make_run("big", "default", gpus=4, seq=10), make_run("open", "default", seq=11)],
        holders,
        now=10.0,
    )
    d = decide(snap)
    assert d.admissions == ()
    reasons = {p.run_id: p for p in d.pending}
    assert reasons["big"].eta is None
    assert "waits for runs h0, h1, h2, which have no max_runtime" in reasons["big"].reason
    assert reasons["open"].reason_code is ReasonCode.RESERVED


def test_quota_reservation_keeps_quota_for_the_anchor() -> None:
    """S3: quota == node; the anchor waits for its project's own runs; a run of the same
    project that would take the quota it waits for starts only if it ends before it."""
    holders = [
        make_run("h0", "default", seq=0, phase=_R, placement=_on(0), max_runtime_s=50.0),
        make_run("h1", "default", seq=1, phase=_R, placement=_on(1), max_runtime_s=50.0),
    ]
    nodes = [make_node("n1", 4), make_node("n2", 4)]
    project = make_project("default", quotas={"a100-80gb": Quota(4, 0)})
    pending = [
        make_run("big", "default", gpus=4, seq=10, max_runtime_s=100.0),
        make_run("long", "default", seq=11, max_runtime_s=500.0),
        make_run("quick", "default", seq=12, max_runtime_s=30.0),
    ]
    d = decide(make_snapshot(nodes, [project], pending, holders, now=10.0, order="submit"))
    assert {a.run_id for a in d.admissions} == {"quick"}
    reasons = {p.run_id: p for p in d.pending}
    assert reasons["big"].eta == 50.0
    assert reasons["long"].reason_code is ReasonCode.RESERVED


_R = make_run("x", phase=__import__("mlops_gpu.model", fromlist=["Phase"]).Phase.RUNNING).phase


def _on(i: int) -> Any:
    from mlops_gpu.testing.builders import placed

    return placed("n1", [str(i)])


def _partial_node(order: str) -> tuple[Any, ...]:
    """An 8-GPU node, a 2-GPU target that the order puts last (longer max_runtime, or a later
    LAS level), and five 1-GPU runs a step that the order prefers: as every cycle begins at least
    2 GPUs are free (the target is never blocked then), and the stream takes them all."""
    holders = [
        (make_run(f"h{i}", "default", seq=i, max_runtime_s=5.0), 1.0 + i % 2) for i in range(8)
    ]
    target = make_run(
        "target",
        "default",
        gpus=2,
        seq=10,
        max_runtime_s=100.0,
        attained_gpu_s=4000.0 if order == "las" else 0.0,
    )

    def arrivals(step: int, now: float) -> list[tuple[Run, float]]:
        return [
            (
                make_run(
                    f"s{step}-{k}",
                    "default",
                    seq=100 + 10 * step + k,
                    submitted_at=now,
                    max_runtime_s=5.0,
                ),
                2.0,
            )
            for k in range(5)
        ]

    template = make_snapshot(
        [make_node("n1", 8)],
        [make_project("default", quotas={"a100-80gb": Quota(16, 0)})],
        now=0.0,
        order=order,
    )
    return template, holders, target, arrivals


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("order", ["shortest", "las"])
def test_overtaken_partial_node_run_becomes_the_anchor(order: str, engine: str) -> None:
    """A run never blocked as a cycle begins but overtaken in it (not admitted while a later run
    of its class was) is kept as the anchor for the next cycle, so it starts then."""
    template, holders, target, arrivals = _partial_node(order)
    out = drive(ENGINES[engine](template), holders, target, arrivals, horizon=60.0)
    assert out.started is not None, f"never started; {out.overtaken} later runs went first"
    assert out.bound is not None and out.started <= out.bound, out
    assert out.started <= 3.0, out


def preempt_around_the_anchor(engine: Any, priority: str, backend: str | None = None) -> Decision:
    """A 4-GPU node held by two runs of the anchor's class (max_runtime 50) and two low-class
    runs without max_runtime; the anchor needs the whole node (it cannot preempt its own class
    without checkpoints); a later 2-GPU run of class ``priority`` could preempt the low-class
    runs, on the node reserved for the anchor."""
    for i in range(2):
        engine.submit(make_run(f"h{i}", "default", seq=i, max_runtime_s=50.0))
        engine.submit(make_run(f"low{i}", "default", seq=2 + i, priority="low"))
    assert len(engine.cycle(0.0).admissions) == 4
    engine.submit(make_run("big", "default", gpus=4, seq=10, submitted_at=1.0))
    engine.submit(
        make_run(
            "mid",
            "default",
            gpus=2,
            seq=11,
            submitted_at=1.0,
            priority=priority,
            max_runtime_s=1e3,
            backend=backend,
        )
    )
    return engine.cycle(1.0)


def preempt_template() -> Any:
    project = make_project("default", quotas={"a100-80gb": Quota(8, 0)})
    return make_snapshot([make_node("n1", 4)], [project], now=0.0, order="submit")


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_preemptor_of_the_anchors_class_does_not_take_its_reserved_gpus(engine: str) -> None:
    """A run of the anchor's class may not preempt its way onto what the anchor waits for
    unless it ends before the reservation (here its time is unknown: none does)."""
    d = preempt_around_the_anchor(ENGINES[engine](preempt_template()), "normal")
    assert d.admissions == () and d.preemptions == (), d


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_preemptor_of_a_higher_class_takes_the_anchors_reserved_gpus(engine: str) -> None:
    d = preempt_around_the_anchor(ENGINES[engine](preempt_template()), "high")
    assert [a.run_id for a in d.admissions] == ["mid"], d
    assert sorted(p.run_id for p in d.preemptions) == ["low0", "low1"], d


def quota_template() -> Any:
    # quota == one node (as init writes it), two nodes: the anchor waits for quota only
    # (n2 is free; the preemptor is pinned to n1's backend, so it does not fit there)
    project = make_project("default", quotas={"a100-80gb": Quota(4, 0)})
    nodes = [make_node("n1", 4, backend="local"), make_node("n2", 4, backend="other")]
    return make_snapshot(nodes, [project], now=0.0, order="submit")


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_preemptor_of_the_anchors_class_does_not_take_the_quota_it_waits_for(
    engine: str,
) -> None:
    """The anchor waits for its project's quota (held by runs without max_runtime, so its time
    is unknown): a run of its class may not preempt low-class runs to take that quota; one of
    a higher class may."""
    d = preempt_around_the_anchor(ENGINES[engine](quota_template()), "normal", "local")
    assert d.admissions == () and d.preemptions == (), d
    d = preempt_around_the_anchor(ENGINES[engine](quota_template()), "high", "local")
    assert [a.run_id for a in d.admissions] == ["mid"], d
    assert sorted(p.run_id for p in d.preemptions) == ["low0", "low1"], d
