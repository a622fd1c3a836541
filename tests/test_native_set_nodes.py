"""``NativeEngine.set_nodes`` (what the autoscale simulator calls when nodes boot, power down or
drain) rebuilds the Rust engine around the new nodes, and the reference
(``FromScratch.set_nodes``) decides on them from its next snapshot: over random event sequences
with capacity changes between cycles (nodes made unschedulable and back), both engines admit,
place and preempt alike, cycle by cycle, and keep the same pending and active runs and the same
anchor (the run that keeps the reservation), and decide as a from-scratch ``decide`` on the
same snapshot (``test_native_core.replay``, whose ``("nodes", up)`` event calls ``set_nodes``
on both).

Skips without the extension (``mlops_gpu._engine``) unless ``MLOPS_GPU_REQUIRE_NATIVE`` is set.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native_core import replay

from mlops_gpu.engines.native import NativeEngine
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot

NODES = 4


def _template(backfill: bool) -> Any:
    nodes = [make_node(f"n{i}", gpus=4) for i in range(NODES)]
    projects = [make_project("p0", nominal=16), make_project("p1", nominal=8, borrowing_limit=8)]
    return make_snapshot(
        nodes, projects, now=0.0, order="shortest", backfill=backfill, preemption=True
    )


@st.composite
def events(draw: st.DrawFn) -> tuple[bool, list[tuple[Any, ...]]]:
    out: list[tuple[Any, ...]] = []
    for i in range(draw(st.integers(5, 40))):
        kind = draw(st.sampled_from(["submit", "submit", "finish", "cycle", "nodes"]))
        if kind == "submit":
            run = make_run(
                f"r{i}",
                draw(st.sampled_from(["p0", "p1"])),
                gpus=draw(st.sampled_from([1, 2, 4])),
                nodes=draw(st.sampled_from([1, 1, 2])),
                seq=i,
                max_runtime_s=draw(st.sampled_from([None, 60.0, 600.0])),
                priority=draw(st.sampled_from(["low", "normal", "high"])),
            )
            out.append(("submit", run))
        elif kind == "finish":
            out.append(("finish", draw(st.integers(0, 50))))
        elif kind == "nodes":  # which nodes are up (schedulable)
            out.append(("nodes", tuple(draw(st.booleans()) for _ in range(NODES))))
        else:
            out.append(("cycle",))
    out.append(("cycle",))
    return draw(st.booleans()), out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events())
def test_set_nodes_rebuilds_the_native_engine_as_the_python_one(
    native_module: Any, scenario: tuple[bool, list[tuple[Any, ...]]]
) -> None:
    backfill, evs = scenario
    replay(native_module, _template(backfill), evs, step=10.0)


def test_the_anchor_survives_a_rebuild(native_module: Any) -> None:
    """A 2-node gang waits behind runs on a full cluster (it holds the reservation); a node goes
    down and comes back: it still holds it on either engine, and starts once the runs end."""
    full = [
        ("submit", make_run(f"a{i}", "p0", gpus=4, seq=i, max_runtime_s=600.0)) for i in range(4)
    ]
    gang = make_run("g", "p0", gpus=4, nodes=2, seq=9, max_runtime_s=60.0)
    evs: list[tuple[Any, ...]] = [*full, ("cycle",), ("submit", gang), ("cycle",)]
    evs += [("nodes", (True, True, True, False)), ("nodes", (True,) * NODES), ("cycle",)]
    evs += [("finish", 0), ("finish", 0), ("cycle",)]
    anchored: list[str] = []
    busy = replay(native_module, _template(True), evs, step=10.0, anchored=anchored)
    assert anchored == ["g", "g"] and busy == 2


def test_a_run_held_on_a_node_that_goes_keeps_its_placement(native_module: Any) -> None:
    template = _template(False)
    nat = NativeEngine(template, native_module)
    nat.submit(make_run("a", "p0", gpus=4, seq=1))
    placed = nat.cycle(10.0).admissions[0].placement
    node = placed.slots[0].node
    nodes = tuple(replace(n, schedulable=n.name != node) for n in template.nodes)
    nat.set_nodes(nodes, 20.0)
    assert nat.active["a"].placement == placed
    nat.submit(make_run("b", "p0", gpus=4, seq=2))
    got = nat.cycle(30.0).admissions[0].placement
    assert got.slots[0].node != node
    with pytest.raises(ValueError, match="not queued"):
        nat._engine.set_anchor("a")
