"""MIG slices and shared GPUs on the native engine (``native/src/parts.rs``, ``mig.rs``,
``shared.rs``): runs that already hold slices or parts of shared devices when the engines start
(loaded from a store: ``add_active``) are booked alike and both engines go on deciding alike;
what the native engine still refuses it refuses by name, and the simulator then falls back to
the Python engine. (The random comparison that draws MIG-partitioned and shared nodes and such
requests is ``tests/test_native_core.py``'s.)
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native_core import TYPES, replay, scenarios

from mlops_gpu.engines import native as native_mod
from mlops_gpu.engines.native import NativeEngine, NotSupported
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import BackendCapabilities, Quota, Run
from mlops_gpu.sim import Cluster
from mlops_gpu.sim.simulator import simulate
from mlops_gpu.sim.trace import synthetic
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot


@pytest.fixture(scope="module")
def native(native_module: Any) -> Any:
    return native_module


def _active_after(template: Any, events: list[tuple[Any, ...]]) -> tuple[Run, ...]:
    """The active runs (some being preempted) after the submits and cycles of ``events`` on
    the Python engine alone: what a store holds when a scheduler starts."""
    ref, now = FromScratch(template), 0.0
    for ev in events:
        now += 1.0
        if ev[0] == "submit":
            ref.submit(replace(ev[1], submitted_at=now))
        elif ev[0] == "cycle":
            ref.cycle(now, ev[1], ev[2] if len(ev) > 2 else None)
    return tuple(ref.active.values())


@st.composite
def loaded(draw: st.DrawFn) -> tuple[Any, list[tuple[Any, ...]], tuple[Run, ...]]:
    template, events = draw(scenarios())
    k = draw(st.integers(1, len(events)))
    return template, events[k:], _active_after(template, events[:k])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loaded())
def test_runs_loaded_holding_slices_and_shares_are_booked_alike(
    native: Any, scenario: tuple[Any, list[tuple[Any, ...]], tuple[Run, ...]]
) -> None:
    template, events, active = scenario
    replay(native, template, [*events, ("cycle", None)], loaded=active)


def test_a_loaded_cluster_of_slices_and_shares_decides_alike(native: Any) -> None:
    """A MIG node (three 1g slices, two held) and a shared node (device "0" half held, "1"
    held by 60 GB of its 80): the engines agree on usage and on the next cycle, where a 1g run
    takes the last slice, a half fits only on "0", a 30 GB cap goes to a free device, and a
    whole-GPU run of a higher class preempts the sharers of the one device it can have."""
    t = TYPES[0]
    nodes = [
        make_node("m0", 0, t, backend="b1", mig={"1g.10gb": ("s0", "s1", "s2")}),
        make_node("s0", 3, t, backend="b1", shared=True, gpu_memory_mb=80000),
    ]
    template = make_snapshot(
        nodes,
        [make_project("p0", quotas={t: Quota(8, None)})],
        now=0.0,
        capabilities={"b1": BackendCapabilities(mig=True, shared_gpus=True)},
        placement="best-fit",
        min_runtime_before_preemption_s=0.0,
    )
    ref, nat = FromScratch(template), NativeEngine(template, native)
    held = {"a": ("m0", "1g.10gb"), "b": ("s0", 0.5), "c": ("s0", 60000)}
    for eng in (ref, nat):
        eng.submit(make_run("a", "p0", gpus=2, mig="1g.10gb", seq=0, priority="low"))
        eng.submit(make_run("b", "p0", gpu_fraction=0.5, seq=1, priority="low"))
        eng.submit(make_run("c", "p0", gpu_memory_mb=60000, seq=2, priority="low"))
    # (admitted by the Python engine, then loaded into fresh engines as a store would)
    ref.cycle(1.0)
    active = tuple(ref.active.values())
    assert {r.id: r.placement.slots[0].node for r in active} == {  # type: ignore[union-attr]
        k: v[0] for k, v in held.items()
    }
    ref, nat = FromScratch(template), NativeEngine(template, native)
    for eng in (ref, nat):
        for run in active:
            eng.add_active(run)
    assert nat.used == ref.used and ref.used[("p0", t)] == pytest.approx(2 / 7 + 0.5 + 0.75)
    for eng in (ref, nat):
        eng.submit(make_run("d", "p0", mig="1g.10gb", seq=3))
        eng.submit(make_run("e", "p0", gpu_fraction=0.5, seq=4))
        eng.submit(make_run("f", "p0", gpu_memory_mb=30000, seq=5))
    got, want = nat.cycle(2.0), ref.cycle(2.0)
    assert (got.admissions, got.preemptions) == (want.admissions, want.preemptions)
    slots = {a.run_id: a.placement.slots[0] for a in got.admissions}
    assert slots["d"].devices == ("s2",) and slots["e"].devices == ("0",)
    assert slots["f"].devices == ("2",) and slots["f"].fraction == 30000 / 80000
    for eng in (ref, nat):
        eng.submit(make_run("w", "p0", gpus=3, seq=6, priority="high", max_runtime_s=60.0))
    got, want = nat.cycle(3.0), ref.cycle(3.0)
    assert (got.admissions, got.preemptions) == (want.admissions, want.preemptions)
    assert [a.run_id for a in got.admissions] == ["w"]
    assert sorted(p.run_id for p in got.preemptions) == ["b", "c", "e", "f"]
    assert nat.used == ref.used


def test_shares_the_cluster_no_longer_has_count_in_quota_alike(native: Any) -> None:
    """A run holding part of a GPU on a node that left the inventory: no node's share is
    booked, its quota is (``core.held``), on both engines."""
    t = TYPES[0]
    template = make_snapshot(
        [make_node("s0", 2, t, backend="b1", shared=True)],
        [make_project("p0", quotas={t: Quota(8, None)})],
        now=0.0,
        capabilities={"b1": BackendCapabilities(shared_gpus=True)},
        placement="best-fit",
    )
    ref = FromScratch(template)
    ref.submit(make_run("a", "p0", gpu_fraction=0.5, seq=0))
    ref.cycle(1.0)
    run = ref.active["a"]
    assert run.placement is not None
    gone = replace(run.placement.slots[0], node="gone")
    moved = replace(run, placement=replace(run.placement, slots=(gone,)))
    py, nat = FromScratch(template), NativeEngine(template, native)
    py.add_active(moved)
    nat.add_active(moved)
    assert nat.used == py.used == {("p0", t): 0.5}


def test_the_simulator_falls_back_to_the_reference_where_native_cannot(
    native: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = synthetic(seed=3, jobs=50, days=0.1)
    cluster = Cluster(2, 8)
    # a job asking for CPU only: the native engine runs it, as the Python engine does
    cpu = replace(trace, jobs=(*trace.jobs[:-1], replace(trace.jobs[-1], gpus=0, cpu_milli=500)))
    nat = simulate(cpu, cluster, "default")
    py = simulate(cpu, cluster, "default", engine="reference")
    assert (nat.engine, py.engine) == ("native", "reference") and nat.segments == py.segments
    # (every config a preset makes is taken: only an absent extension falls back)
    monkeypatch.setattr(native_mod, "_engine", None)  # as installed without cargo
    assert simulate(trace, cluster, "default").engine == "reference"
    with pytest.raises(NotSupported, match="not installed"):
        simulate(trace, cluster, "default", engine="native")


def test_two_profiles_no_node_offers_queue_apart(native: Any) -> None:
    """Runs asking for two MIG profiles that no node offers, charged the same share (2/7):
    the Python core queues them apart (``queue_keys.shape_key`` keys by the profile's name), so the
    native engine must too (each such profile gets a number of its own, not one for all), or
    the second would be explained by the first's shape."""
    t = TYPES[0]
    template = make_snapshot(
        [make_node("m0", 0, t, backend="b1", mig={"1g.10gb": ("s0", "s1", "s2")})],
        [make_project("p0", quotas={t: Quota(8, None)})],
        now=0.0,
        capabilities={"b1": BackendCapabilities(mig=True)},
        placement="best-fit",
    )
    events = [
        ("submit", make_run("x", "p0", mig="2g.20gb", seq=0)),
        ("submit", make_run("y", "p0", mig="2g.24gb", seq=1)),
        ("submit", make_run("z", "p0", mig="1g.10gb", seq=2)),
        ("cycle", None),
        ("cycle", None),
    ]
    replay(native, template, events)
    nat = NativeEngine(template, native)
    for _, run in events[:3]:
        nat.submit(run)
    why = {p.run_id: p.reason for p in nat.explain_all(1.0)}
    assert "2g.20gb" in why["x"] and "2g.24gb" in why["y"], why


def test_a_placed_memory_cap_over_quota_is_judged_by_its_share(native: Any) -> None:
    """p1's run holds half of s0; p0 has no quota of its own, and its cohort half a GPU idle
    to lend. A 50 GB cap of p0 fits on s1 (80 GB), where it is charged 0.625 of a GPU: more
    than the cohort lends, so it waits on quota, and the reason says it needs 0.625 (the
    placement's share, as ``cycle._try`` judged it), not the whole GPU an unplaced memory cap
    counts as (the random comparison found the native engine naming 1)."""
    t = TYPES[0]
    template = make_snapshot(
        [make_node(f"s{i}", 1, t, backend="b1", shared=True, gpu_memory_mb=80000) for i in (0, 1)],
        [make_project(f"p{i}", quotas={t: Quota(i, None)}, cohort="team") for i in (0, 1)],
        now=0.0,
        capabilities={"b1": BackendCapabilities(shared_gpus=True)},
        placement="best-fit",
    )
    half = make_run("h", "p1", gpu_fraction=0.5, seq=0)
    cap = make_run("m", "p0", gpu_memory_mb=50000, seq=1)
    replay(native, template, [("submit", half), ("cycle", None), ("submit", cap), ("cycle", None)])
    for eng in (FromScratch(template), NativeEngine(template, native)):
        eng.submit(half)
        eng.cycle(1.0)
        eng.submit(cap)
        [why] = eng.explain_all(2.0)
        assert why.reason_code.value == "quota", why
        assert "0.5 idle to lend; it needs 0.625" in why.reason, why


#: Shared requests by fraction (None: a whole GPU), placed one per cycle.
_SHARES = (0.25, 0.5, 0.75, None)


@pytest.mark.parametrize("first", _SHARES)
def test_shared_devices_under_fragmentation_aware_placement_are_placed_alike(
    native: Any, first: float | None
) -> None:
    """Shared nodes under ``placement: fragmentation`` (they make the cluster one to weigh):
    each part goes where its node's expected fragmentation grows least (``after_share``), a
    whole GPU by the signatures the parts leave, and a run that accepts either type takes the
    type whose placement fragments least. Every sequence of four requests (the first fixed by
    the parameter), alternately with host CPU and restricted to one type, is decided alike by
    both engines at every cycle. (The random comparison draws such clusters too, but seldom a
    choice where best-fit and the fragmentation scores part: serving the parts best-fit here
    fails this test.)"""
    a, h = TYPES
    nodes = [
        make_node("s0", 2, a, backend="b1", shared=True, gpu_memory_mb=80000),
        make_node("s1", 2, a, backend="b1", shared=True, gpu_memory_mb=80000, cpu_milli=16000),
        make_node("s2", 2, h, backend="b1", shared=True, gpu_memory_mb=80000),
    ]
    template = make_snapshot(
        nodes,
        [make_project("p0")],
        now=0.0,
        capabilities={"b1": BackendCapabilities(shared_gpus=True)},
        placement="fragmentation",
    )
    for rest in itertools.product(_SHARES, repeat=3):
        events: list[tuple[Any, ...]] = []
        for k, frac in enumerate((first, *rest)):
            run = make_run(
                f"r{k}",
                "p0",
                gpus=1,
                seq=k,
                cpu_milli=1000 * (k % 2),
                gpu_types=[a] if k == 2 else [],
                **({} if frac is None else {"gpu_fraction": frac}),
            )
            events += [("submit", run), ("cycle", None)]
        replay(native, template, events)
