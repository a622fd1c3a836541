"""The indexes a ``State`` builds from a snapshot equal the plain computations they stand for,
over random sequences of submits, completions, preemptions, checkpoints and capacity changes
driven through the reference engine (``FromScratch``): the nodes' timelines of expected ends
(``backfill._timelines``) and the walk over them (``backfill.reach_on``). And a table case of
the order without fair share."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops_gpu.core.backfill import _timelines, reach_on
from mlops_gpu.core.policy import decide
from mlops_gpu.core.state import State
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import Phase, Quota
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from mlops_gpu.testing.builders import placed

TYPES = ["a100-80gb", "h100-80gb"]
PRIOS = ["low", "normal", "high"]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[object, list[tuple[object, ...]]]:
    nodes = [
        make_node(
            f"n{i}",
            draw(st.sampled_from([2, 4, 8])),
            draw(st.sampled_from(TYPES)),
            backend=draw(st.sampled_from(["b1", "b2"])),
        )
        for i in range(draw(st.integers(2, 5)))
    ]
    projects = [
        make_project(
            f"p{i}",
            cohort=draw(st.sampled_from([None, "org"])),
            quotas={
                t: Quota(draw(st.integers(0, 10)), draw(st.one_of(st.none(), st.integers(0, 6))))
                for t in TYPES
            },
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    template = make_snapshot(
        nodes,
        projects,
        now=0.0,
        queueing=draw(st.sampled_from(["best-effort-fifo", "strict-fifo"])),
        order=draw(st.sampled_from(["submit", "las", "shortest"])),
        backfill=draw(st.booleans()),
        preemption=draw(st.booleans()),
        fair_share=draw(st.booleans()),
        # same-class victims become ready as the clock moves (1 s per event) or they checkpoint
        min_runtime_before_preemption_s=draw(st.sampled_from([0.0, 3.0, 10.0])),
        preempt_uncheckpointed=draw(st.booleans()),
        # shortest-first preemption of other projects' borrowers (``core.borrowers``)
        shortest_preempt_borrowers=draw(st.booleans()),
        borrower_share_ratio=draw(st.sampled_from([1.0, 1.5])),
    )
    events: list[tuple[object, ...]] = []
    for i in range(draw(st.integers(5, 40))):
        kind = draw(st.sampled_from(["submit", "submit", "cycle", "finish", "nodes", "checkpoint"]))
        if kind == "submit":
            events.append(
                (
                    "submit",
                    make_run(
                        f"r{i}",
                        draw(st.sampled_from(projects)).name,
                        gpus=draw(st.integers(1, 8)),
                        nodes=draw(st.sampled_from([1, 1, 2])),
                        seq=i,
                        submitted_at=float(i),
                        priority=draw(st.sampled_from(PRIOS)),
                        gpu_types=draw(st.sampled_from([[], TYPES[:1], TYPES[1:]])),
                        max_runtime_s=draw(st.one_of(st.none(), st.floats(5, 100))),
                        preemptible=draw(st.booleans()) or True,
                        attained_gpu_s=draw(st.sampled_from([0.0, 5000.0, 50000.0])),
                    ),
                )
            )
        elif kind in ("finish", "checkpoint"):
            events.append((kind, draw(st.integers(0, 50))))
        elif kind == "nodes":
            events.append(("nodes", draw(st.integers(0, len(nodes) - 1))))
        else:
            events.append(("cycle",))
    events.append(("cycle",))
    return template, events


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_state_indexes_equal_the_plain_computations(
    scenario: tuple[object, list[tuple[object, ...]]],
) -> None:
    template, events = scenario
    replay(template, events)


def replay(template: object, events: list[tuple[object, ...]]) -> None:
    """Drive the reference engine through ``events``; at every cycle the indexes of the state
    built from its snapshot must equal the plain computations."""
    eng = FromScratch(template)  # type: ignore[arg-type]
    now = 0.0
    for ev in events:
        now += 1.0
        if ev[0] == "submit":
            eng.submit(replace(ev[1], submitted_at=now))  # type: ignore[type-var]
        elif ev[0] == "finish" and eng.active:
            rid = sorted(eng.active)[int(ev[1]) % len(eng.active)]  # type: ignore[call-overload]
            run = eng.finish(rid)
            if run.preempt_requested:  # a victim exits and queues again, after a backoff
                eng.submit(
                    replace(
                        run,
                        phase=Phase.PENDING,
                        placement=None,
                        admitted_at=None,
                        started_at=None,
                        preempt_requested=False,
                        attempt=run.attempt + 1,
                        not_before=now + 2.0,
                    )
                )
        elif ev[0] == "checkpoint" and eng.active:
            rid = sorted(eng.active)[int(ev[1]) % len(eng.active)]  # type: ignore[call-overload]
            eng.checkpoint(rid, now)
        elif ev[0] == "nodes":
            nodes = list(eng.template.nodes)
            i = int(ev[1]) % len(nodes)  # type: ignore[call-overload]
            nodes[i] = replace(nodes[i], schedulable=not nodes[i].schedulable)
            eng.set_nodes(tuple(nodes), now)
        elif ev[0] == "cycle":
            snap = eng.snapshot(now)
            state = State.from_snapshot(snap)
            lines = _timelines(snap)  # the index of expected ends matches a plain count
            for node in snap.nodes:
                line = lines.get(node.name, [])
                assert state.lines(node.name, now) == line
                for free, need in ((0, 1), (0, 2), (1, 4), (0, 8)):  # the walk without the line
                    got_free, got_when = state.reach(node.name, now, free, need)
                    want_free, want_when = reach_on(line, free, need, now)
                    assert (got_free >= need, got_when) == (want_free >= need, want_when)
            eng.cycle(now)  # (applied: the next cycle's state has its admissions and victims)


def test_without_fair_share_blocked_queues_still_order_the_projects() -> None:
    """Without fair share, a project's turn comes by its oldest queue head, and a queue that
    cannot fit counts: here project a's blocked 8-GPU run
    (t=1) puts a before b, whose own blocked 8-GPU run (t=2) puts b before a's second small
    run (t=5); so b's small run (t=6) starts before it. An engine that skipped the blocked
    queues would order the projects by their small runs instead (a: 3, 5; b: 6)."""
    nodes = [make_node("n0", 8)]
    projects = [
        make_project("a", 0, None, cohort="org"),
        make_project("b", 0, None, cohort="org"),
        make_project("c", 8, 0, cohort="org"),
    ]
    template = make_snapshot(
        nodes, projects, now=0.0, fair_share=False, preemption=False, backfill=False
    )
    eng = FromScratch(template)
    held = placed("n0", [str(d) for d in range(6)])
    eng.add_active(make_run("c1", "c", gpus=6, phase=Phase.RUNNING, placement=held))
    for rid, project, gpus, t in (
        ("a-big", "a", 8, 1.0),
        ("b-big", "b", 8, 2.0),
        ("a1", "a", 1, 3.0),
        ("a2", "a", 1, 5.0),
        ("b1", "b", 1, 6.0),
    ):
        eng.submit(make_run(rid, project, gpus=gpus, seq=int(t), submitted_at=t))
    ref = decide(eng.snapshot(10.0))
    got = eng.cycle(10.0)
    assert [a.run_id for a in ref.admissions] == ["a1", "b1"]
    assert got.admissions == ref.admissions
