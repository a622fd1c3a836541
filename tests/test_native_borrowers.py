"""``policy.shortest_preempt_borrowers`` on both engines: the Rust engine
(``native/src/preempt/borrowers.rs``) takes long runs of borrowing cohort members for short
runs exactly as the Python core (``core/borrowers.py``), cycle by cycle.

``borrowing`` draws clusters where that happens: one cohort whose idle lender leaves most of
the nominal quota to members that borrow it with long runs, then short runs of members over
their nominal queue behind them (with checkpoints, finishes and usage history that move the
fair shares). ``replay`` compares admissions, placements, preemptions (with their messages),
pending reasons, sentences and ETAs at every cycle. The table cases are compared in
``tests/core/test_borrowers.py``; the setting is also drawn by ``test_native_core``'s
generators.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native_core import TYPES, replay

from mlops_gpu.engines.native import NativeEngine
from mlops_gpu.model import Quota
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot

ORG = "org"


@st.composite
def borrowing(draw: st.DrawFn) -> tuple[Any, list[tuple[Any, ...]]]:
    """Members of one cohort fill the cluster by borrowing, then short runs queue."""
    n_nodes = draw(st.integers(1, 3))
    t = TYPES[0]
    nodes = [make_node(f"n{i}", 4, t, backend="b1") for i in range(n_nodes)]
    members = [
        make_project(
            f"p{i}",
            cohort=ORG,
            quotas={t: Quota(draw(st.integers(0, 2)), None)},
            weight=draw(st.sampled_from([1.0, 1.0, 2.0])),
        )
        for i in range(draw(st.integers(2, 4)))
    ]
    lender = make_project("lender", cohort=ORG, quotas={t: Quota(4 * n_nodes, None)})
    template = make_snapshot(
        nodes,
        [*members, lender],
        now=0.0,
        order="shortest",
        shortest_preempt_borrowers=True,
        shortest_preempt_ratio=draw(st.sampled_from([1.0, 2.0, 8.0])),
        borrower_share_ratio=draw(st.sampled_from([1.0, 1.0, 1.5])),
        min_runtime_before_preemption_s=draw(st.sampled_from([0.0, 0.0, 2.0])),
        preempt_uncheckpointed=draw(st.sampled_from([True, True, False])),
        half_life_s=draw(st.sampled_from([60.0, 3600.0])),
        backfill=draw(st.booleans()),
    )
    events: list[tuple[Any, ...]] = []
    seq = 0

    def submit(max_runtime: list[float | None], prio: list[str]) -> None:
        nonlocal seq
        events.append(
            (
                "submit",
                make_run(
                    f"r{seq:02d}",
                    draw(st.sampled_from(members)).name,
                    gpus=draw(st.sampled_from([1, 1, 2, 4])),
                    seq=seq,
                    max_runtime_s=draw(st.sampled_from(max_runtime)),
                    priority=draw(st.sampled_from(prio)),
                ),
            )
        )
        seq += 1

    # the long borrowers (more than the cluster holds: the rest queue behind the short runs)
    for _ in range(draw(st.integers(2 * n_nodes, 4 * n_nodes))):
        submit([5000.0, 5000.0, 50_000.0, None], ["normal", "normal", "normal", "low"])
    events.append(("cycle", None))
    for _ in range(draw(st.integers(0, 4))):
        events.append(("checkpoint", draw(st.integers(0, 50))))
    for _ in range(draw(st.integers(8, 30))):
        kind = draw(st.sampled_from(["submit", "submit", "cycle", "cycle", "finish", "checkpoint"]))
        if kind == "submit":
            submit([2.0, 5.0, 60.0, 600.0, 5000.0], [*["normal"] * 4, "high"])
        elif kind == "finish":
            events.append(("finish", draw(st.integers(0, 50)), draw(st.booleans())))
        elif kind == "checkpoint":
            events.append(("checkpoint", draw(st.integers(0, 50))))
        else:
            history = {(m.name, t): draw(st.sampled_from([0.0, 1800.0, 7200.0])) for m in members}
            events.append(("cycle", draw(st.sampled_from([None, None, history]))))
    events.append(("cycle", None))
    return template, events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(borrowing())
def test_borrowers_are_preempted_alike(
    native_module: Any, scenario: tuple[Any, list[tuple[Any, ...]]]
) -> None:
    template, events = scenario
    replay(native_module, template, events)


def _taken(template: Any, events: list[tuple[Any, ...]], module: Any) -> list[str]:
    """The messages of the victims the native engine took by the rule over ``events``."""
    eng, now, out = NativeEngine(template, module), 0.0, []
    for ev in events:
        now += 1.0
        if ev[0] == "submit":
            eng.submit(replace(ev[1], submitted_at=now))
        elif ev[0] == "checkpoint" and eng.active:
            eng.checkpoint(sorted(eng.active)[ev[1] % len(eng.active)], now)
        elif ev[0] == "cycle":
            out += [p.reason for p in eng.cycle(now).preemptions if "across" in p.reason]
    return out


def test_the_comparison_sees_the_rule(native_module: Any) -> None:
    """Project p1 borrows the lender's idle nominal with long runs; a short run of p0 (over
    its nominal, lower share) takes one of them on both engines; a native engine built
    without the setting does not, and the replay fails."""
    t = TYPES[0]
    projects = [
        make_project("p0", cohort=ORG, quotas={t: Quota(0, None)}),
        make_project("p1", cohort=ORG, quotas={t: Quota(0, None)}),
        make_project("lender", cohort=ORG, quotas={t: Quota(4, None)}),
    ]
    template = make_snapshot(
        [make_node("n0", 4, t, backend="b1")],
        projects,
        now=0.0,
        order="shortest",
        shortest_preempt_borrowers=True,
        min_runtime_before_preemption_s=0.0,
    )
    events: list[tuple[Any, ...]] = [
        *(("submit", make_run(f"b{i}", "p1", seq=i, max_runtime_s=50_000.0)) for i in range(4)),
        ("cycle", None),
        ("checkpoint", 0),
        ("submit", make_run("s", "p0", seq=9, max_runtime_s=60.0)),
        ("cycle", None),
    ]
    assert replay(native_module, template, events) == 2
    (why,) = _taken(template, events, native_module)
    assert why.startswith("preempted for run s of project p0 (shortest first across projects")
    off = replace(template, policy=replace(template.policy, shortest_preempt_borrowers=False))
    with pytest.raises(AssertionError):
        replay(native_module, template, events, native_template=off)
