"""Shares and slices of GPUs held across many cycles, on both engines (issue 25): a project's
holding (``Capacity.used``) is the exact sum of what its runs hold, whatever the order they
came and went in, so fair share, which breaks a tie between projects by name, sees a tie where
there is one, in the Python reference engine, the native engine and ``decide`` alike.

Summed as floats, sevenths (MIG slices) came out a last bit apart depending on that order:
the throughput benchmark's ``--setup rich`` at 40 nodes first differed at its 51st cycle.
``replay`` (``test_native_core``) checks both engines and ``decide`` at every cycle.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native_core import TYPES, replay

from mlops_gpu.engines.native import NativeEngine
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import NodeSlot, Phase, Placement, Quota
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot

#: MIG slices of every size a share can be summed from (sevenths), on one or two GPUs' worth
SLICES = {"1g.10gb": ("s0", "s1", "s2"), "2g.20gb": ("s3", "s4", "s5"), "3g.40gb": ("s6", "s7")}


@pytest.fixture(scope="module")
def native(native_module: Any) -> Any:
    return native_module


def test_fair_share_ties_on_sevenths_are_exact_on_both_engines(native: Any) -> None:
    """Issue 25, reduced: p0 holds MIG slices worth one GPU (2/7 + 3/7 + 2/7, left after
    admitting 2g, 2g, 3g, 3g, 2g one cycle each and two of them ending), p1 one whole GPU, so
    their shares tie exactly and the tie goes by name: p0's run takes the one free GPU. Summed
    as floats in the order runs came and went, p0's holding was 1.0000000000000002 in the
    incremental engine of the time (and 1.0 from scratch), and p1 went first:
    ``Capacity.used`` counts in ``UNIT``s since. Both engines and ``decide`` at every cycle
    (``replay``)."""
    t = TYPES[0]
    nodes = [make_node("m", 0, t, backend="b1", mig=SLICES), make_node("w", 2, t, backend="b1")]
    projects = [make_project(p, quotas={t: Quota(8, None)}) for p in ("p0", "p1")]
    template = make_snapshot(nodes, projects, now=0.0, placement="best-fit")
    events: list[tuple[Any, ...]] = [("submit", make_run("whole", "p1", seq=0)), ("cycle", None)]
    for i, profile in enumerate(["2g.20gb", "2g.20gb", "3g.40gb", "3g.40gb", "2g.20gb"]):
        events += [("submit", make_run(f"s{i}", "p0", seq=i + 1, mig=profile)), ("cycle", None)]
    # the active runs by id: s0 s1 s2 s3 s4 whole; s0 (a 2g) ends, then s2 (a 3g: the second
    # of s1 s2 s3 s4 whole)
    events += [("finish", 0, False), ("finish", 1, False)]
    events += [
        ("submit", make_run("x", "p0", seq=10)),
        ("submit", make_run("y", "p1", seq=11)),
        ("cycle", None),
    ]
    assert replay(native, template, events) == 7
    ref = FromScratch(template)
    nat = NativeEngine(template, native)
    for eng in (ref, nat):
        for ev in events[:-3]:
            if ev[0] == "submit":
                eng.submit(ev[1])
            elif ev[0] == "cycle":
                eng.cycle(0.0)
        for rid in ("s0", "s2"):
            eng.finish(rid)
        eng.submit(events[-3][1])
        eng.submit(events[-2][1])
        assert eng.used == {("p0", t): 1.0, ("p1", t): 1.0}
        assert [a.run_id for a in eng.cycle(1.0).admissions] == ["x"]


@st.composite
def churned(draw: st.DrawFn) -> tuple[Any, list[tuple[Any, ...]]]:
    """Projects of equal weight taking turns at MIG slices of every size and whole GPUs, on
    nodes that may track host CPU and memory, with preemption: many runs come and go, so a
    project's holding is summed in many orders, and shares tie often."""
    host = draw(st.booleans())
    nodes = [
        make_node(
            f"m{i}",
            draw(st.sampled_from([0, 1, 2])),
            TYPES[0],
            backend="b1",
            mig=SLICES,
            cpu_milli=16000 if host else None,
            host_memory_mb=64000 if host else None,
        )
        for i in range(draw(st.integers(1, 2)))
    ]
    nodes.append(make_node("w", draw(st.sampled_from([1, 2, 4])), TYPES[0], backend="b1"))
    projects = [make_project(f"p{i}", quotas={TYPES[0]: Quota(4, None)}) for i in range(3)]
    template = make_snapshot(
        nodes,
        projects,
        now=0.0,
        placement="best-fit",
        order=draw(st.sampled_from(["submit", "shortest"])),
        min_runtime_before_preemption_s=0.0,
        preempt_uncheckpointed=True,
    )
    events: list[tuple[Any, ...]] = []
    for i in range(draw(st.integers(10, 60))):
        kind = draw(st.sampled_from(["submit", "submit", "cycle", "cycle", "finish"]))
        if kind == "submit":
            profile = draw(st.sampled_from([None, "1g.10gb", "2g.20gb", "3g.40gb"]))
            shape = {} if profile is None else {"mig": profile}
            run = make_run(
                f"r{i:02d}",
                draw(st.sampled_from(projects)).name,
                seq=i,
                max_runtime_s=draw(st.sampled_from([5.0, 50.0, None])),
                priority=draw(st.sampled_from(["normal", "normal", "high"])),
                cpu_milli=draw(st.sampled_from([0, 2000, 8000])),
                host_memory_mb=draw(st.sampled_from([0, 16000])),
                **shape,
            )
            events.append(("submit", run))
        elif kind == "finish":
            events.append(("finish", draw(st.integers(0, 50)), False))
        else:
            events.append(("cycle", None))
    events.append(("cycle", None))
    return template, events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(churned())
def test_both_engines_decide_alike_as_slices_come_and_go(
    native: Any, scenario: tuple[Any, list[tuple[Any, ...]]]
) -> None:
    template, events = scenario
    replay(native, template, events)


def test_a_shared_devices_used_fraction_is_exact_on_both_engines(native: Any) -> None:
    """A shared device held by 0.1 + 0.4 + 0.2 (loaded in that order) whose 0.4 ends holds
    3/10 exactly, as another device holding 0.3 alone does: a 0.1 run then sees both with 0.6
    left after it, and best fit breaks the tie by name (s0). Summed as floats in the order
    runs came and went, the first device's used fraction was 0.29999999999999993 in both
    incremental engines (left 0.6000000000000001, so s1 won) and 0.30000000000000004 from
    scratch (``decide``, s0): both ``Capacity`` now sum a device's shares in ``UNIT``s."""
    nodes = [make_node(s, 2, TYPES[0], shared=True) for s in ("s0", "s1")]
    quotas = {TYPES[0]: Quota(8, None)}
    template = make_snapshot(nodes, [make_project("p0", quotas=quotas)], placement="best-fit")
    held = [("a1", 0.1, "s0"), ("a2", 0.4, "s0"), ("a3", 0.2, "s0"), ("k", 0.3, "s1")]
    loaded = tuple(
        make_run(
            rid,
            "p0",
            1,
            gpu_fraction=f,
            phase=Phase.RUNNING,
            placement=Placement("local", TYPES[0], (NodeSlot(node, ("0",), fraction=f),)),
            admitted_at=0.0,
        )
        for rid, f, node in held
    )
    events: list[tuple[Any, ...]] = [
        ("finish", 1, False),  # (a2: the ids sorted)
        ("submit", make_run("w", "p0", 1, gpu_fraction=0.1, seq=1)),
        ("cycle", None),
    ]
    assert replay(native, template, events, loaded=loaded) == 1
    ref = FromScratch(template)
    for r in loaded:
        ref.add_active(r)
    ref.finish("a2")
    ref.submit(make_run("w", "p0", 1, gpu_fraction=0.1, seq=1))
    [admitted] = ref.cycle(5.0).admissions
    assert admitted.placement is not None and admitted.placement.slots[0].node == "s0"
