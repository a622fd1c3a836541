"""The order of projects without fair share: a blocked queue head still counts."""

from __future__ import annotations

from mlops_gpu.core.policy import decide
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import Phase
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from mlops_gpu.testing.builders import placed


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
