"""Property tests (hypothesis) of every decision on random clusters, projects and workloads:
no node over capacity, no project above nominal + borrowing limit, gangs whole or not at all,
victims preemptible and of lower priority or borrowing (or, of the preemptor's own class, ready:
checkpointed, past the minimum runtime), no wasted preemption (every victim's preemptor is
admitted in the same decision, on devices its victims held or with the quota they held), every
pending run explained, and the same decision for the same snapshot. Runs being preempted hold
nothing: their devices may be booked again."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops_gpu.core import Snapshot, decide
from mlops_gpu.core.quota import QuotaBook, cohort_roots
from mlops_gpu.model import Phase, Quota
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from mlops_gpu.testing.builders import placed_gang
from tests.core.cases import on_native_too

TYPES = ["a100-80gb", "h100-80gb"]
PRIOS = ["low", "normal", "high"]


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes = [
        make_node(
            f"n{i}",
            draw(st.integers(1, 8)),
            draw(st.sampled_from(TYPES)),
            backend=draw(st.sampled_from(["b1", "b2"])),
            labels={"rack": draw(st.sampled_from(["r1", "r2"]))},
            schedulable=draw(st.booleans()) or i == 0,
        )
        for i in range(draw(st.integers(1, 6)))
    ]
    projects = [
        make_project(
            f"p{i}",
            cohort=draw(st.sampled_from([None, "org"])),
            quotas={
                t: Quota(
                    draw(st.integers(0, 12)),
                    draw(st.one_of(st.none(), st.integers(0, 8))),
                    draw(st.one_of(st.none(), st.integers(0, 4))),
                )
                for t in TYPES
            },
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    free = {n.name: list(n.devices) for n in nodes}
    active = []
    for i in range(draw(st.integers(0, 8))):
        k = draw(st.integers(1, 4))
        width = draw(st.integers(1, 2))
        cands = [n for n in nodes if len(free[n.name]) >= k]
        if len(cands) < width:
            continue
        chosen = draw(st.permutations(cands))[:width]
        if len({n.gpu_type for n in chosen}) != 1 or len({n.backend for n in chosen}) != 1:
            continue
        slots = []
        for n in chosen:
            slots.append((n.name, free[n.name][:k]))
            free[n.name] = free[n.name][k:]
        active.append(
            make_run(
                f"a{i}",
                draw(st.sampled_from(projects)).name,
                gpus=k,
                nodes=width,
                phase=Phase.RUNNING,
                placement=placed_gang(slots, chosen[0].gpu_type, chosen[0].backend),
                priority=draw(st.sampled_from(PRIOS)),
                preemptible=draw(st.booleans()),
                started_at=draw(st.floats(0, 900)),
                last_checkpoint_at=draw(st.one_of(st.none(), st.floats(0, 1000))),
                max_runtime_s=draw(st.one_of(st.none(), st.floats(10, 5000))),
                preempt_requested=draw(st.integers(0, 9)) == 0,
            )
        )
    pending = [
        make_run(
            f"r{i}",
            draw(st.sampled_from(projects)).name,
            gpus=draw(st.integers(1, 9)),
            nodes=draw(st.sampled_from([1, 1, 1, 2])),
            seq=i,
            submitted_at=draw(st.integers(0, 5)),
            priority=draw(st.sampled_from(PRIOS)),
            gpu_types=draw(st.sampled_from([[], TYPES[:1], TYPES[1:]])),
            max_runtime_s=draw(st.one_of(st.none(), st.floats(10, 5000))),
            topology_key=draw(st.sampled_from([None, "rack"])),
            attained_gpu_s=draw(st.floats(0, 90_000)),
        )
        for i in range(draw(st.integers(0, 14)))
    ]
    return make_snapshot(
        nodes,
        projects,
        pending,
        active,
        queueing=draw(st.sampled_from(["best-effort-fifo"] * 3 + ["strict-fifo"])),
        order=draw(st.sampled_from(["submit", "las", "shortest"])),
        backfill=draw(st.booleans()),
        min_runtime_before_preemption_s=draw(st.sampled_from([0.0, 300.0, 600.0])),
        preempt_uncheckpointed=draw(st.booleans()),
        shortest_preempt_borrowers=draw(st.booleans()),
        usage_history={(p.name, t): draw(st.floats(0, 50_000)) for p in projects for t in TYPES},
    )


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_every_decision_keeps_the_invariants(snap: Snapshot) -> None:
    d = decide(snap)
    assert d == decide(snap)  # a pure function of the snapshot
    on_native_too(snap)  # the Rust engine decides and explains alike
    nodes = {n.name: n for n in snap.nodes}
    held: dict[str, set[str]] = defaultdict(set)
    used: dict[tuple[str, str], float] = defaultdict(float)
    victims = {p.run_id for p in d.preemptions}
    for r in snap.active:  # runs being preempted (and this decision's victims) hold nothing
        assert r.placement is not None
        if r.preempt_requested:
            continue
        used[(r.project, r.placement.gpu_type)] += r.placement.gpu_amount
        if r.id in victims:
            continue
        for s in r.placement.slots:
            held[s.node] |= set(s.devices)
    before = dict(used)
    for r in snap.active:
        if r.id in victims:
            assert r.placement is not None
            used[(r.project, r.placement.gpu_type)] -= r.placement.gpu_amount
    pending = {r.id: r for r in snap.pending}
    for a in d.admissions:
        run = pending.pop(a.run_id)
        assert len(a.placement.slots) == run.request.nodes  # a gang: whole
        assert len({s.node for s in a.placement.slots}) == run.request.nodes
        assert len({nodes[s.node].backend for s in a.placement.slots}) == 1
        for s in a.placement.slots:
            node = nodes[s.node]
            assert node.schedulable and node.gpu_type == a.placement.gpu_type
            assert run.request.accepts(node.gpu_type)
            assert len(s.devices) == run.request.gpus and set(s.devices) <= set(node.devices)
            assert not set(s.devices) & held[s.node], "a device booked twice"
            held[s.node] |= set(s.devices)
        used[(run.project, a.placement.gpu_type)] += a.placement.gpu_amount
    for (project, gpu_type), amount in used.items():
        q = snap.projects[project].quota(gpu_type)
        if q.borrowing_limit is not None and amount > before.get((project, gpu_type), 0.0):
            assert amount <= q.nominal + q.borrowing_limit + 1e-9, (project, gpu_type, amount)
    roots = cohort_roots(snap)
    active = {r.id: r for r in snap.active}
    admitted = {a.run_id: a.placement for a in d.admissions}
    pending_all = {r.id: r for r in snap.pending}
    by_preemptor: dict[str, list[str]] = defaultdict(list)
    for pre in d.preemptions:
        by_preemptor[pre.for_run].append(pre.run_id)
    for rid, ids in by_preemptor.items():
        # no wasted preemption: its preemptor starts on what its victims give back
        assert rid in admitted, f"{rid} preempted {ids} but was not admitted"
        mine = {(s.node, d) for s in admitted[rid].slots for d in s.devices}
        freed = {
            (s.node, d)
            for v in ids
            for s in active[v].placement.slots  # type: ignore[union-attr]
            for d in s.devices
        }
        # or it needed the quota they held: with the usage before the decision and the
        # admissions ahead of it, its project's quota would not admit it
        preemptor = next(r for r in snap.pending if r.id == rid)
        usage: dict[tuple[str, str], float] = defaultdict(float, before)
        for a in d.admissions:
            if a.run_id == rid:
                break
            usage[(pending_all[a.run_id].project, a.placement.gpu_type)] += a.placement.gpu_amount
        t = admitted[rid].gpu_type
        needs_quota = any(active[v].project != preemptor.project for v in ids) or not QuotaBook(
            snap, usage
        ).admits(preemptor.project, t, admitted[rid].gpu_amount)
        assert mine & freed or needs_quota, (rid, ids)
    pol = snap.policy
    for pre in d.preemptions:
        victim, preemptor = active[pre.run_id], next(r for r in snap.pending if r.id == pre.for_run)
        assert victim.spec.preemptible and not victim.preempt_requested
        assert pre.lost_gpu_s >= 0.0
        if victim.project == preemptor.project and snap.priority_of(victim) == snap.priority_of(
            preemptor
        ):
            # rule B: a run of the preemptor's own class must be ready
            assert victim.last_checkpoint_at is not None or pol.preempt_uncheckpointed
            start = victim.started_at if victim.started_at is not None else victim.admitted_at
            assert start is not None
            assert snap.now - start >= pol.min_runtime_before_preemption_s
        if victim.project == preemptor.project:
            lower = snap.priority_of(victim) < snap.priority_of(preemptor)
            same = snap.priority_of(victim) == snap.priority_of(preemptor)
            las = snap.policy.order == "las" and same
            shortest = (
                snap.policy.order == "shortest"
                and same
                and preemptor.spec.max_runtime_s is not None
                and victim.spec.max_runtime_s is not None  # an unknown end is no victim
                and (
                    (victim.started_at or victim.admitted_at or snap.now)
                    + victim.spec.max_runtime_s
                    - snap.now
                    > preemptor.spec.max_runtime_s
                )
            )
            assert lower or las or shortest
        else:
            t = victim.placement.gpu_type  # type: ignore[union-attr]
            assert roots[victim.project] is not None
            assert roots[victim.project] == roots[preemptor.project]
            assert before[(victim.project, t)] > snap.projects[victim.project].quota(t).nominal
    explained = {p.run_id for p in d.pending}
    assert explained == set(pending)
    assert all(p.reason for p in d.pending)
