"""Job control in the core (``eligibility``, ``gated``): holds, begin times, dependencies of
each kind and array limits, their reasons and ETAs; and, on random workloads, that the
reference engine behind the gate decides what ``decide`` decides, that no run starts before its
dependencies are met and that an array never runs more than its ``%N`` elements."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops_gpu.core import ReasonCode, decide
from mlops_gpu.engines.gated import Gated
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import Dependency, Phase
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from mlops_gpu.testing.builders import placed

NOW = 1000.0


def dep(kind: str, rid: str) -> tuple[Dependency, ...]:
    return (Dependency(kind, rid),)


def snap_with(pending: list[Any], active: list[Any] = (), ended: dict[str, Any] | None = None):  # type: ignore[assignment,no-untyped-def]
    s = make_snapshot([make_node("n1", 8)], [make_project("p", 8)], pending, active, now=NOW)
    return replace(s, ended=ended or {})


def element(i: int, limit: int | None = 2, aid: str = "a1") -> Any:
    return make_run(f"{aid}_{i}", seq=10 + i, array_id=aid, array_index=i, array_limit=limit)


RUNNING = make_run("up", phase=Phase.RUNNING, placement=placed("n1", ["0"]))

# (id, pending runs, active runs, ended, admitted ids, {run: (code, eta)}, doomed ids)
CASES: list[
    tuple[str, list[Any], list[Any], dict[str, Any], set[str], dict[str, Any], set[str]]
] = [
    ("held", [make_run("h", held=True)], [], {}, set(), {"h": ("held", None)}, set()),
    (
        "begin time to come: ETA is the begin time",
        [make_run("b", begin_at=NOW + 3600)],
        [],
        {},
        set(),
        {"b": ("begin_time", NOW + 3600)},
        set(),
    ),
    ("begin time passed", [make_run("b", begin_at=NOW - 1)], [], {}, {"b"}, {}, set()),
    (
        "afterok on a running run waits, naming it",
        [make_run("d", dependencies=dep("afterok", "up"))],
        [RUNNING],
        {},
        set(),
        {"d": ("dependency", None)},
        set(),
    ),
    (
        "afterok on a pending run waits",
        [make_run("x", seq=0, gpus=16), make_run("d", seq=1, dependencies=dep("afterok", "x"))],
        [],
        {},
        set(),
        {"d": ("dependency", None)},
        set(),
    ),
    (
        "afterok met",
        [make_run("d", dependencies=dep("afterok", "x"))],
        [],
        {"x": Phase.SUCCEEDED},
        {"d"},
        {},
        set(),
    ),
    (
        "afterok on a failed run: doomed",
        [make_run("d", dependencies=dep("afterok", "x"))],
        [],
        {"x": Phase.FAILED},
        set(),
        {"d": ("dependency", None)},
        {"d"},
    ),
    (
        "afterok on a cancelled run: doomed",
        [make_run("d", dependencies=dep("afterok", "x"))],
        [],
        {"x": Phase.CANCELLED},
        set(),
        {"d": ("dependency", None)},
        {"d"},
    ),
    (
        "dependency on an unknown run: doomed",
        [make_run("d", dependencies=dep("afterany", "nobody"))],
        [],
        {},
        set(),
        {"d": ("dependency", None)},
        {"d"},
    ),
    (
        "afternotok met by a failure",
        [make_run("d", dependencies=dep("afternotok", "x"))],
        [],
        {"x": Phase.FAILED},
        {"d"},
        {},
        set(),
    ),
    (
        "afternotok on a success: doomed",
        [make_run("d", dependencies=dep("afternotok", "x"))],
        [],
        {"x": Phase.SUCCEEDED},
        set(),
        {"d": ("dependency", None)},
        {"d"},
    ),
    (
        "afterany met by a cancel",
        [make_run("d", dependencies=dep("afterany", "x"))],
        [],
        {"x": Phase.CANCELLED},
        {"d"},
        {},
        set(),
    ),
    (
        "held wins over a dependency still to end",
        [make_run("d", held=True, dependencies=dep("afterany", "up"))],
        [RUNNING],
        {},
        set(),
        {"d": ("held", None)},
        set(),
    ),
    (
        "a doom wins over a hold",
        [make_run("d", held=True, dependencies=dep("afterok", "x"))],
        [],
        {"x": Phase.FAILED},
        set(),
        {"d": ("dependency", None)},
        {"d"},
    ),
    (
        "array %2: the first two elements are considered",
        [element(i) for i in range(4)],
        [],
        {},
        {"a1_0", "a1_1"},
        {"a1_2": ("array_limit", None), "a1_3": ("array_limit", None)},
        set(),
    ),
    (
        "array %2 with one element running: one more",
        [element(i) for i in range(1, 4)],
        [replace(element(0), phase=Phase.RUNNING, placement=placed("n1", ["0"]))],
        {},
        {"a1_1"},
        {"a1_2": ("array_limit", None), "a1_3": ("array_limit", None)},
        set(),
    ),
    (
        "array without a limit",
        [element(i, limit=None) for i in range(3)],
        [],
        {},
        {"a1_0", "a1_1", "a1_2"},
        {},
        set(),
    ),
    (
        "a held element does not take the array's room",
        [replace(element(0), held=True), element(1), element(2), element(3)],
        [],
        {},
        {"a1_1", "a1_2"},
        {"a1_0": ("held", None), "a1_3": ("array_limit", None)},
        set(),
    ),
]


@pytest.mark.parametrize(
    "pending,active,ended,admitted,reasons,doomed",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_job_control_table(
    pending: list[Any],
    active: list[Any],
    ended: dict[str, Any],
    admitted: set[str],
    reasons: dict[str, Any],
    doomed: set[str],
) -> None:
    d = decide(snap_with(pending, active, ended))
    assert {a.run_id for a in d.admissions} == admitted
    got = {p.run_id: p for p in d.pending}
    for rid, (code, eta) in reasons.items():
        assert got[rid].reason_code == ReasonCode(code), got[rid]
        assert got[rid].eta == eta
    assert {p.run_id for p in d.doomed} == doomed
    assert set(got) | admitted == {r.id for r in pending}  # every run has a reason


def test_dependency_reason_names_the_blocking_ids() -> None:
    runs = [make_run("x", seq=0, gpus=16), make_run("y", seq=1, gpus=16)]
    d_run = make_run(
        "d", seq=2, dependencies=(Dependency("afterok", "x"), Dependency("afterany", "y"))
    )
    d = decide(snap_with([*runs, d_run]))
    why = {p.run_id: p for p in d.pending}["d"].reason
    assert "x" in why and "y" in why and "afterok" in why


@pytest.mark.parametrize(
    "phase,kind,words",
    [
        (Phase.FAILED, "afterok", "run x failed"),
        (Phase.CANCELLED, "afterok", "run x cancelled"),
        (Phase.SUCCEEDED, "afternotok", "run x succeeded"),
        (None, "afterany", "run x does not exist"),
    ],
    ids=["failed", "cancelled", "succeeded", "unknown"],
)
def test_doomed_reason_says_why(phase: Phase | None, kind: str, words: str) -> None:
    d = decide(snap_with([make_run("d", dependencies=dep(kind, "x"))], ended={"x": phase}))
    assert len(d.doomed) == 1 and words in d.doomed[0].reason


def test_a_doomed_run_names_the_dependency_decide_names() -> None:
    """Two dependencies fail, the later one in the run's list first: ``decide`` names the first
    in the list that can never be met, so the gate, which doomed the run at the first end,
    judges it again at the second (found by the random comparison below)."""
    x, y = make_run("x", seq=0), make_run("y", seq=1)
    d_run = make_run(
        "d", seq=2, dependencies=(Dependency("afterok", "x"), Dependency("afterok", "y"))
    )
    template = snap_with([])
    eng = Gated(FromScratch(template))
    for r in (x, y, d_run):
        eng.submit(r)
    eng.cycle(NOW)  # x and y run
    for rid in ("y", "x"):
        eng.finish(rid)
        eng.ended(rid, Phase.FAILED)
    got = eng.cycle(NOW + 1).doomed
    want = decide(snap_with([d_run], ended={"x": Phase.FAILED, "y": Phase.FAILED})).doomed
    assert got == want and "run x failed" in got[0].reason
    # doomed as it is submitted (y failed already), then x fails too
    eng = Gated(FromScratch(template))
    eng.submit(x)
    eng.cycle(NOW)
    eng.ended("y", Phase.FAILED)
    eng.submit(d_run)
    assert "run y failed" in eng.cycle(NOW + 1).doomed[0].reason
    eng.finish("x")
    eng.ended("x", Phase.FAILED)
    assert eng.cycle(NOW + 2).doomed == want


# -- random workloads: the gated reference engine equals decide; the invariants hold -----------


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Any, list[tuple[Any, ...]]]:
    template = make_snapshot(
        [make_node(f"n{i}", 4) for i in range(draw(st.integers(1, 3)))],
        [make_project("p", 12, borrowing_limit=None)],
        now=0.0,
        order=draw(st.sampled_from(["submit", "shortest"])),
        preemption=False,
    )
    events: list[tuple[Any, ...]] = []
    ids: list[str] = []
    for i in range(draw(st.integers(5, 40))):
        kind = draw(st.sampled_from(["run", "run", "array", "cycle", "finish", "release"]))
        if kind == "run":
            deps: tuple[Dependency, ...] = ()
            wants_deps: bool = draw(st.booleans())
            if ids and wants_deps:
                deps = tuple(
                    Dependency(draw(st.sampled_from(["afterok", "afternotok", "afterany"])), t)
                    for t in draw(st.lists(st.sampled_from(ids), min_size=1, max_size=2))
                )
            run = make_run(
                f"r{i}",
                gpus=draw(st.integers(1, 4)),
                seq=len(ids),
                dependencies=deps,
                held=draw(st.sampled_from([False, False, False, True])),
                begin_at=draw(st.sampled_from([None, None, 5.0, 30.0])),
                max_runtime_s=draw(st.sampled_from([None, 10.0])),
            )
            events.append(("submit", run))
            ids.append(run.id)
        elif kind == "array":
            limit = draw(st.sampled_from([None, 1, 2, 3]))
            gpus = draw(st.integers(1, 2))
            for k in range(draw(st.integers(1, 5))):
                rid = f"a{i}_{k}"
                run = make_run(rid, gpus=gpus, seq=len(ids), array_id=f"a{i}",
                               array_index=k, array_limit=limit)  # fmt: skip
                events.append(("submit", run))
                ids.append(rid)
        elif kind == "finish":
            events.append(("finish", draw(st.integers(0, 50)),
                           draw(st.sampled_from([Phase.SUCCEEDED, Phase.FAILED]))))  # fmt: skip
        elif kind == "release":
            events.append(("release", draw(st.integers(0, 50))))
        else:
            events.append(("cycle",))
    events += [("cycle",)] * 3
    return template, events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_gated_engine_decides_as_decide_and_keeps_the_rules(
    scenario: tuple[Any, list[tuple[Any, ...]]],
) -> None:
    template, events = scenario
    ref, eng = FromScratch(template), Gated(FromScratch(template))
    ended: dict[str, Phase | None] = {}
    now = 0.0
    for ev in events:
        now += 1.0
        if ev[0] == "submit":
            run = replace(ev[1], submitted_at=now)
            ref.submit(run)
            eng.submit(run)
        elif ev[0] == "finish" and eng.active:
            rid = sorted(eng.active)[ev[1] % len(eng.active)]
            ref.finish(rid)
            eng.finish(rid)
            ended[rid] = ev[2]
            ref.ended(rid, ev[2])
            eng.ended(rid, ev[2])
        elif ev[0] == "release":
            held = sorted(r for r, run in eng.pending.items() if run.held)
            if held:
                rid = held[ev[1] % len(held)]
                run = replace(eng.pending[rid], held=False)
                ref.remove_pending(rid)
                eng.remove_pending(rid)
                ref.submit(run)
                eng.submit(run)
        elif ev[0] == "cycle":
            before = dict(ref.pending)
            want = ref.cycle(now)
            got = eng.cycle(now)
            assert [(a.run_id, a.placement) for a in got.admissions] == [
                (a.run_id, a.placement) for a in want.admissions
            ]
            assert got.doomed == want.doomed
            for a in want.admissions:  # no run starts before its dependencies are met
                for d in before[a.run_id].spec.dependencies:
                    assert d.run_id in ended
                    assert (
                        ended[d.run_id]
                        in {
                            "afterany": {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED},
                            "afterok": {Phase.SUCCEEDED},
                            "afternotok": {Phase.FAILED, Phase.CANCELLED},
                        }[d.kind]
                    )
                assert not before[a.run_id].held
                assert (before[a.run_id].spec.begin_at or 0.0) <= now
            counts: dict[str, int] = {}
            for r in eng.active.values():
                if r.spec.array_id is not None:
                    counts[r.spec.array_id] = counts.get(r.spec.array_id, 0) + 1
                    assert counts[r.spec.array_id] <= (r.spec.array_limit or 10**9)
            for p in got.doomed:  # the controller cancels them
                ref.remove_pending(p.run_id)
                eng.remove_pending(p.run_id)
                ended[p.run_id] = Phase.CANCELLED
                ref.ended(p.run_id, Phase.CANCELLED)
                eng.ended(p.run_id, Phase.CANCELLED)
    reasons = {p.run_id for p in eng.explain_all(now)}
    assert reasons == set(eng.pending)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_native_engine_behind_the_gate_decides_as_the_python_one(
    native_module: Any, scenario: tuple[Any, list[tuple[Any, ...]]]
) -> None:
    from mlops_gpu.engines.native import NativeEngine

    template, events = scenario
    py, rs = Gated(FromScratch(template)), Gated(NativeEngine(template, native_module))
    now = 0.0
    for ev in events:
        now += 1.0
        if ev[0] == "submit":
            run = replace(ev[1], submitted_at=now)
            py.submit(run)
            rs.submit(run)
        elif ev[0] == "finish" and py.active:
            rid = sorted(py.active)[ev[1] % len(py.active)]
            for eng in (py, rs):
                eng.finish(rid)
                eng.ended(rid, ev[2])
        elif ev[0] == "release":
            held = sorted(r for r, run in py.pending.items() if run.held)
            if held:
                rid = held[ev[1] % len(held)]
                run = replace(py.pending[rid], held=False)
                for eng in (py, rs):
                    eng.remove_pending(rid)
                    eng.submit(run)
        elif ev[0] == "cycle":
            a, b = py.cycle(now), rs.cycle(now)
            assert [(x.run_id, x.placement) for x in a.admissions] == [
                (x.run_id, x.placement) for x in b.admissions
            ]
            assert a.doomed == b.doomed
            for p in a.doomed:
                for eng in (py, rs):
                    eng.remove_pending(p.run_id)
                    eng.ended(p.run_id, Phase.CANCELLED)
