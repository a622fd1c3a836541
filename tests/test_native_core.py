"""The native engine (``mlops_gpu.engines.native``, Rust in ``native/``) is the same policy: over
random clusters, quotas, cohort trees, policies and event sequences it admits, places and
preempts exactly as the Python reference engine (``FromScratch``: ``decide`` on a snapshot per
cycle), cycle by cycle; it explains the
same before every cycle (reason codes, sentences and ETAs of every pending run, worked out in
Rust and rendered from the Python core's table); on the throughput benchmark's workload it
prints the Python core's digest; and it refuses, by name, what it does not implement.
The scenarios draw CPU-only runs (``gpus`` 0) too: ordering the nodes for one by the least CPU
per free GPU instead of the most, on the Rust side alone, was checked to fail the first test.

The extension is ``mlops_gpu._engine``, built by ``pip install -e .`` where cargo exists.
Without it these tests skip, unless ``MLOPS_GPU_REQUIRE_NATIVE`` is set (CI sets it): then they
fail.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from conftest import core_bench
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops_gpu.core.decision import Decision
from mlops_gpu.core.policy import decide
from mlops_gpu.engines.native import NativeEngine, unsupported
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import BackendCapabilities, Budget, Cohort, Phase, Quota
from mlops_gpu.sim import Cluster
from mlops_gpu.sim.metrics import summarize
from mlops_gpu.sim.simulator import simulate
from mlops_gpu.sim.trace import synthetic
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot

TYPES = ["a100-80gb", "h100-80gb"]
PRIOS = ["low", "normal", "high"]
#: A project's budget: none, or 1 GPU-hour per hour whose end makes its runs wait, lowers
#: them to ``low`` or to a class the cluster lacks (which changes nothing).
BUDGETS = [
    None,
    None,
    Budget(3600.0, gpu_hours=1.0),
    Budget(3600.0, gpu_hours=1.0, action="lower", lower_to="low"),
    Budget(3600.0, usd=5.0, action="lower", lower_to="nonesuch"),
]
#: A node's labels: a rack (two of them), a zone as well, or none.
LABELS = [
    {},
    {"rack": "r0"},
    {"rack": "r1"},
    {"rack": "r1", "zone": "z0"},
    {"rack": "r0", "zone": "z1"},
]
#: A run's topology: none, or a rack or zone (or a key no node has), required or preferred.
TOPOLOGY: list[dict[str, Any]] = [
    {},
    {},
    {"topology_key": "rack"},
    {"topology_key": "rack", "topology_required": True},
    {"topology_key": "zone", "topology_required": True},
    {"topology_key": "zone"},
    {"topology_key": "row", "topology_required": True},
]
#: A node's MIG slices by profile (MIG-partitioned nodes; 7g takes a whole GPU's share).
_SLICED = {"1g.10gb": ("s0", "s1", "s2"), "3g.40gb": ("s3",)}
MIG: list[dict[str, tuple[str, ...]]] = [{}, {}, _SLICED, {"7g.80gb": ("s4",), "1g.10gb": ("s5",)}]
#: A run's share of GPUs: whole (most), MIG slices (also of a profile no node has), part of a
#: shared device by fraction, memory or both, or none (CPU-only: ``gpus`` 0 on one node, with
#: host CPU and/or memory); (gpus, nodes) where the shape fixes them.
SHAPES: list[tuple[dict[str, Any], tuple[int, int] | None]] = [
    *[({}, None)] * 3,
    *[({}, (0, 1))] * 2,
    ({"mig": "1g.10gb"}, None),
    *(({"mig": p}, (1, 1)) for p in ("3g.40gb", "7g.80gb", "2g.20gb")),
    *(({"gpu_fraction": 0.5}, (1, 1)), ({"gpu_memory_mb": 50000}, (1, 1))),
    ({"gpu_fraction": 0.25, "gpu_memory_mb": 30000}, (1, 1)),
]
#: What a cycle is told the budgeted projects spent (None: the template's, nothing).
SPENT = [None, None, {"p0": (2.0, 0.0)}, {"p1": (0.5, 9.0), "p2": (1.0, 0.0)}]


@pytest.fixture(scope="module")
def native(native_module: Any) -> Any:
    return native_module


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Any, list[tuple[Any, ...]]]:
    # nodes tracking host CPU and memory, under either placement (fragmentation-aware placement
    # weighs them: the mix of active runs' shapes, the types' headroom)
    host = draw(st.booleans())
    placement = draw(st.sampled_from(["fragmentation", "fragmentation", "best-fit"]))
    sharing = draw(st.booleans())  # (shared devices, under either placement)
    nodes = [
        make_node(
            f"n{i}",
            draw(st.sampled_from([2, 4, 8])),
            draw(st.sampled_from(TYPES)),
            backend=draw(st.sampled_from(["b1", "b2"])),
            schedulable=draw(st.sampled_from([True, True, True, False])),
            labels=draw(st.sampled_from(LABELS)),
            cpu_milli=draw(st.sampled_from([None, 8000, 16000])) if host else None,
            host_memory_mb=draw(st.sampled_from([None, 64000])) if host else None,
            mig=draw(st.sampled_from(MIG)),
            shared=sharing and draw(st.booleans()),
            gpu_memory_mb=draw(st.sampled_from([None, 80000])),
        )
        for i in range(draw(st.integers(2, 6)))
    ]
    projects = [
        make_project(
            f"p{i}",
            cohort=draw(st.sampled_from([None, "org", "team"])),
            quotas={
                t: Quota(
                    draw(st.integers(0, 10)),
                    draw(st.one_of(st.none(), st.integers(0, 6))),
                    draw(st.one_of(st.none(), st.integers(0, 4))),
                )
                for t in TYPES
            },
            weight=draw(st.sampled_from([1.0, 1.0, 2.0, 0.5])),
            budget=draw(st.sampled_from(BUDGETS)),
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    template = make_snapshot(
        nodes,
        projects,
        now=0.0,
        cohorts=["org", "team"],
        capabilities={
            "b1": BackendCapabilities(multi_node=True, mig=True, shared_gpus=True),
            "b2": BackendCapabilities(
                multi_node=draw(st.booleans()), mig=draw(st.booleans()), shared_gpus=True
            ),
        },
        queueing=draw(st.sampled_from(["best-effort-fifo", "best-effort-fifo", "strict-fifo"])),
        order=draw(st.sampled_from(["submit", "shortest", "shortest", "las"])),
        backfill=draw(st.booleans()),
        preemption=draw(st.sampled_from([True, True, False])),
        fair_share=draw(st.sampled_from([True, True, False])),
        shortest_preempt_ratio=draw(st.sampled_from([1.0, 8.0])),
        shortest_preempt_borrowers=draw(st.booleans()),
        borrower_share_ratio=draw(st.sampled_from([1.0, 1.0, 2.0])),
        half_life_s=draw(st.sampled_from([60.0, 3600.0])),
        min_runtime_before_preemption_s=draw(st.sampled_from([0.0, 3.0, 600.0])),
        preempt_uncheckpointed=draw(st.booleans()),
        placement=placement,
    )
    # a cohort tree: team lends and borrows within org
    template = replace(template, cohorts={"org": Cohort("org"), "team": Cohort("team", "org")})
    events: list[tuple[Any, ...]] = []
    for i in range(draw(st.integers(5, 45))):
        kinds = ["submit", "submit", "submit", "cycle", "cycle", "finish", "checkpoint"]
        kind = draw(st.sampled_from(kinds))
        if kind == "submit":
            gpus, width = draw(st.sampled_from([(1, 1), (2, 1), (3, 1), (4, 1), (8, 1), (2, 2)]))
            shape, fixed = draw(st.sampled_from(SHAPES))
            if shape or fixed:
                gpus, width = fixed or (min(gpus, 3), 1)
            project = draw(st.sampled_from([*(p.name for p in projects), "nobody"]))
            cpu = draw(st.sampled_from([0, 0, 1000, 4000, 8000]))
            memory = draw(st.sampled_from([0, 0, 16000, 48000]))
            if gpus == 0:  # a CPU-only run asks for some host CPU or memory, often much
                memory = draw(st.sampled_from([memory, 48000]))
                cpu = cpu or (0 if memory else draw(st.sampled_from([2000, 12000])))
            run = make_run(
                f"r{i:02d}",
                project,
                gpus=gpus,
                nodes=width,
                seq=i,
                priority=draw(st.sampled_from([*PRIOS, "normal", "urgent"])),
                gpu_types=draw(st.sampled_from([[], TYPES[:1], TYPES[1:], TYPES])),
                max_runtime_s=draw(st.one_of(st.none(), st.sampled_from([2.0, 5.0, 40.0, 400.0]))),
                preemptible=draw(st.sampled_from([True, True, False])),
                backend=draw(st.sampled_from([None, None, "b1", "b2", "gone"])),
                grace_s=draw(st.sampled_from([0.0, 1.5, 30.0])),
                attained_gpu_s=draw(st.sampled_from([0.0, 0.0, 5000.0, 50000.0])),
                **draw(st.sampled_from(TOPOLOGY)),
                cpu_milli=cpu,
                host_memory_mb=memory,
                **shape,
            )
            events.append(("submit", run))
        elif kind == "finish":
            events.append(("finish", draw(st.integers(0, 50)), draw(st.booleans())))
        elif kind == "checkpoint":
            events.append(("checkpoint", draw(st.integers(0, 50))))
        else:
            history = draw(st.sampled_from([None, None, {("p0", TYPES[0]): 7200.0}]))
            events.append(("cycle", history, draw(st.sampled_from(SPENT))))
    events.append(("cycle", None))
    return template, events


def replay(
    module: Any,
    template: Any,
    events: list[tuple[Any, ...]],
    native_template: Any = None,
    loaded: tuple[Any, ...] = (),
    step: float = 1.0,
    anchored: list[str] | None = None,
) -> int:
    """Drive both engines through ``events`` (the native one built from ``native_template``
    when given), ``step`` seconds apart; at every cycle their decisions, pending and active
    runs and kept anchors must be equal, and the decisions those of a from-scratch cycle
    (``decide``) on the same snapshot, each victim's preemptor admitted in the same decision.
    Events: ``("submit", run)``, ``("finish", i[, backoff])`` (the i-th active run by id; a
    victim queues again, after a backoff where asked), ``("checkpoint", i)``,
    ``("cycle"[, usage_history[, spent]])``, ``("nodes", up)`` (which of the template's nodes
    are schedulable: ``set_nodes`` on both, which must keep the anchor, appended to
    ``anchored`` where there is one). Returns how many cycles admitted or preempted
    something."""
    ref = FromScratch(template)
    nat = NativeEngine(native_template or template, module)
    for run in loaded:  # active runs that hold their placement already (from a store)
        ref.add_active(run)
        nat.add_active(run)
    now, busy = max((r.admitted_at or 0.0 for r in loaded), default=0.0), 0
    for ev in events:
        now += step
        if ev[0] == "submit":
            run = replace(ev[1], submitted_at=now)
            ref.submit(run)
            nat.submit(run)
        elif ev[0] == "finish" and ref.active:
            rid = sorted(ref.active)[ev[1] % len(ref.active)]
            run = ref.finish(rid)
            assert nat.finish(rid) == run
            backoff = len(ev) > 2 and ev[2]
            if run.preempt_requested:  # a victim exits and queues again, after a backoff
                again = replace(
                    run,
                    phase=Phase.PENDING,
                    placement=None,
                    preempt_requested=False,
                    attempt=run.attempt + 1,
                    not_before=now + 2.0 if backoff else None,
                    last_checkpoint_at=now - 0.5 if backoff else None,
                )
                ref.submit(again)
                nat.submit(again)
        elif ev[0] == "checkpoint" and ref.active:
            rid = sorted(ref.active)[ev[1] % len(ref.active)]
            ref.checkpoint(rid, now)
            nat.checkpoint(rid, now)
        elif ev[0] == "nodes":
            nodes = tuple(
                replace(n, schedulable=up) for n, up in zip(template.nodes, ev[1], strict=True)
            )
            before = ref.kept_anchor()
            ref.set_nodes(nodes, now)
            nat.set_nodes(nodes, now)
            assert nat.kept_anchor() == ref.kept_anchor() == before
            if before is not None and anchored is not None:
                anchored.append(before)
            assert nat.pending == ref.pending and nat.active == ref.active
        elif ev[0] == "cycle":
            ev = (*ev, None, None)  # (no usage history, nothing spent, where not given)
            spent = ev[2]
            snap = ref.snapshot(now)
            if ev[1] is not None:
                snap = replace(snap, usage_history=ev[1])
            if spent is not None:
                snap = replace(snap, spent=spent)
            scratch = decide(snap)
            # explained alike, before the cycle (an explanation applies nothing): codes,
            # sentences and ETAs of every pending run
            explained = nat.explain_all(now, ev[1], spent)
            assert {p.run_id: p for p in explained} == {p.run_id: p for p in scratch.pending}, now
            assert len(explained) == len(scratch.pending)
            want = ref.cycle(now, ev[1], spent)
            got = nat.cycle(now, ev[1], spent)
            assert got.admissions == want.admissions == scratch.admissions, now
            assert got.preemptions == want.preemptions == scratch.preemptions, now
            assert {p.for_run for p in got.preemptions} <= {a.run_id for a in got.admissions}
            assert nat.pending == ref.pending
            assert nat.active == ref.active
            assert nat.kept_anchor() == ref.kept_anchor()
            busy += bool(got.admissions or got.preemptions)
    return busy


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_native_engine_decides_as_the_python_engine(
    native: Any, scenario: tuple[Any, list[tuple[Any, ...]]]
) -> None:
    template, events = scenario
    replay(native, template, events)


@st.composite
def contended(draw: st.DrawFn) -> tuple[Any, list[tuple[Any, ...]]]:
    """A full cluster under ``order: shortest`` (or ``las``) with preemption and backfill: the
    cascades of victims, reservations and borrowing the throughput benchmark is made of; on
    nodes that may track host CPU, with CPU-only runs contending for it too (preempting, and
    preempted, for host CPU)."""
    host = draw(st.booleans())
    nodes = [
        make_node(
            f"n{i}",
            8,
            TYPES[i % 2],
            backend="b1",
            labels=draw(st.sampled_from(LABELS)),
            cpu_milli=draw(st.sampled_from([16000, 32000])) if host else None,
        )
        for i in range(draw(st.integers(2, 6)))
    ]
    projects = [
        make_project(
            f"p{i}",
            cohort=f"c{i % 2}",
            quotas={t: Quota(draw(st.integers(2, 16)), None) for t in TYPES},
        )
        for i in range(4)
    ]
    template = make_snapshot(
        nodes,
        projects,
        now=0.0,
        order=draw(st.sampled_from(["shortest", "las"])),
        min_runtime_before_preemption_s=draw(st.sampled_from([0.0, 2.0, 600.0])),
        preempt_uncheckpointed=draw(st.booleans()),
        shortest_preempt_borrowers=draw(st.booleans()),
        borrower_share_ratio=draw(st.sampled_from([1.0, 1.5])),
    )
    events: list[tuple[Any, ...]] = []
    for i in range(draw(st.integers(20, 70))):
        kind = draw(st.sampled_from(["submit", "submit", "cycle", "cycle", "finish", "checkpoint"]))
        if kind == "submit":
            sizes = [(1, 1), (2, 1), (4, 1), (8, 1), (4, 2), *[(0, 1)] * (3 if host else 0)]
            gpus, width = draw(st.sampled_from(sizes))
            cpu = 0
            if host:  # (a CPU-only run asks for more: it contends for host CPU)
                cpu = draw(st.sampled_from([8000, 16000, 24000] if gpus == 0 else [0, 8000, 16000]))
            run = make_run(
                f"r{i:02d}",
                draw(st.sampled_from(projects)).name,
                gpus=gpus,
                nodes=width,
                seq=i,
                priority=draw(st.sampled_from(PRIOS[:2])),
                gpu_types=[draw(st.sampled_from(TYPES))],
                max_runtime_s=draw(st.sampled_from([2.0, 5.0, 50.0, 400.0, None])),
                attained_gpu_s=draw(st.sampled_from([0.0, 0.0, 4000.0, 40000.0])),
                **draw(st.sampled_from(TOPOLOGY)),
                cpu_milli=cpu,
            )
            events.append(("submit", run))
        elif kind == "finish":
            events.append(("finish", draw(st.integers(0, 50)), False))
        elif kind == "checkpoint":
            events.append(("checkpoint", draw(st.integers(0, 50))))
        else:
            events.append(("cycle", None))
    events.append(("cycle", None))
    return template, events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contended())
def test_native_engine_decides_as_the_python_engine_under_contention(
    native: Any, scenario: tuple[Any, list[tuple[Any, ...]]]
) -> None:
    template, events = scenario
    replay(native, template, events)


def test_unknown_topology_keys_are_queues_of_their_own(native: Any) -> None:
    """Two runs alike but for a topology key no node has ("zone", "rack") are two queues in
    the reference: the second is judged on its own, here once the cohort's idle quota is
    gone, and explained so. The native engine numbered every unknown key alike, made one
    queue of them and explained the second as the first (found by the contention property
    test)."""
    nodes = [make_node("n0", 8, TYPES[0], backend="b1")]
    projects = [
        make_project(p, cohort="c0", quotas={TYPES[0]: Quota(2, None)}) for p in ("p0", "p2")
    ]
    template = make_snapshot(nodes, projects, now=0.0, order="shortest")
    events: list[tuple[Any, ...]] = []
    for seq, gpus, mr, key in [
        (13, 1, 2.0, None),
        (14, 1, 2.0, None),
        (15, 1, 2.0, None),
        (16, 1, 5.0, None),
        (17, 2, 5.0, "rack"),
        (19, 2, 2.0, "zone"),
    ]:
        run = make_run(
            f"r{seq}",
            "p0",
            gpus=gpus,
            seq=seq,
            priority="low",
            max_runtime_s=mr,
            topology_key=key,
            topology_required=key is not None,
        )
        events.append(("submit", run))
    events.append(("cycle", None))
    replay(native, template, events)


def test_the_checks_can_fail(native: Any) -> None:
    """A scenario with admissions, preemptions and reservations; the same replay against a
    deliberately different policy (no preemption on one side) fails."""
    nodes = [make_node("n0", 8, TYPES[0], backend="b1"), make_node("n1", 8, TYPES[0], backend="b1")]
    projects = [
        make_project(f"p{i}", cohort="org", quotas={TYPES[0]: Quota(8, None)}) for i in (0, 1)
    ]
    template = make_snapshot(
        nodes,
        projects,
        now=0.0,
        order="shortest",
        min_runtime_before_preemption_s=0.0,
        preempt_uncheckpointed=True,
    )
    events: list[tuple[Any, ...]] = []
    for i in range(12):
        run = make_run(f"r{i:02d}", f"p{i % 2}", gpus=4, seq=i, max_runtime_s=1000.0 / (i + 1))
        events += [("submit", run), ("cycle", None)]
    assert replay(native, template, events) >= 3
    other = replace(template, policy=replace(template.policy, preemption=False))
    with pytest.raises(AssertionError):
        replay(native, template, events, native_template=other)


def test_a_preemptor_starts_with_its_victim_which_then_holds_nothing(native: Any) -> None:
    """Rules A and B on both engines: a same-class victim must have checkpointed and run the
    minimum, and have a known end (a run without max_runtime is none); the preemptor is
    admitted in the decision that preempts, the victim's lost work since its checkpoint comes
    back, and the victim holds nothing from then on."""
    nodes = [make_node(f"n{i}", 8, TYPES[0], backend="b1") for i in (0, 1)]
    template = make_snapshot(
        nodes, [make_project("p0", quotas={TYPES[0]: Quota(16, None)})], now=0.0
    )
    ref, nat = FromScratch(template), NativeEngine(template, native)
    both = (ref, nat)
    endless = make_run("endless", "p0", gpus=8, seq=0)
    long = make_run("long", "p0", gpus=8, seq=1, max_runtime_s=100_000.0)
    short = make_run("short", "p0", gpus=8, seq=2, max_runtime_s=600.0)
    for eng in both:
        eng.submit(endless)
        eng.submit(long)

    def cycle(now: float) -> Decision:  # (the Python engine's carries reasons too)
        got, want = nat.cycle(now), ref.cycle(now)
        assert got == replace(want, pending=())
        return got

    assert len(cycle(1.0).admissions) == 2
    for eng in both:
        eng.checkpoint("endless", 100.0)
        eng.checkpoint("long", 100.0)
        eng.submit(short)
    # 499 s after their start: too soon for a same-class preemption
    assert cycle(500.0) == Decision()
    got = cycle(700.0)
    assert [a.run_id for a in got.admissions] == ["short"]
    [p] = got.preemptions
    assert (p.run_id, p.for_run, p.lost_gpu_s) == ("long", "short", 8 * 600.0)
    assert got.admissions[0].placement.slots == ref.active["long"].placement.slots  # type: ignore[union-attr]
    assert nat.active["long"].preempt_requested and nat.pending == {}
    assert nat.used == ref.used == {("p0", TYPES[0]): 16.0}  # endless and short
    assert nat.finish("long") == ref.finish("long")
    assert nat.used == ref.used == {("p0", TYPES[0]): 16.0}


def _reclaim(native: Any) -> tuple[Any, Decision]:
    """A cohort tree that lends nothing as the cycle begins (b borrows all of a's 8 GPUs); a's
    run reclaims them for 1 GPU: the tree lends 7 again within that cycle, to c's borrowers,
    which come after a's run (within nominal) whatever their class. Returns the state before
    that cycle and the native engine's decision."""
    t = TYPES[0]
    template = make_snapshot(
        [make_node("n0", 8, t, backend="b1")],
        [
            make_project(name, cohort="org", quotas={t: Quota(nominal, None)})
            for name, nominal in (("a", 8), ("b", 0), ("c", 0))
        ],
        now=0.0,
    )
    ref, nat = FromScratch(template), NativeEngine(template, native)
    for eng in (ref, nat):
        eng.submit(make_run("v", "b", gpus=8, seq=0))
        eng.cycle(1.0)
        eng.submit(make_run("x", "c", gpus=1, seq=1, priority="high"))  # borrows after r
        eng.submit(make_run("r", "a", gpus=1, seq=2))  # reclaims v's borrowing
        eng.submit(make_run("w", "c", gpus=1, seq=3, priority="low"))
    return ref.snapshot(2.0), nat.cycle(2.0)


def test_quota_a_victim_gives_back_is_lent_again_in_the_same_cycle(native: Any) -> None:
    _, got = _reclaim(native)
    assert [a.run_id for a in got.admissions] == ["r", "x", "w"]
    assert [(p.run_id, p.for_run) for p in got.preemptions] == [("v", "r")]


def test_quota_a_victim_gives_back_decide_agrees(native: Any) -> None:
    snap, got = _reclaim(native)
    want = decide(snap)
    assert (got.admissions, got.preemptions) == (want.admissions, want.preemptions)


def test_explanations_are_the_python_cores(native: Any) -> None:
    nodes = [make_node("n0", 4, TYPES[0], backend="b1")]
    projects = [make_project("p0", cohort="org", quotas={TYPES[0]: Quota(4, 0)})]
    template = make_snapshot(nodes, projects, now=0.0)
    ref, nat = FromScratch(template), NativeEngine(template, native)
    for i in range(4):
        run = make_run(f"r{i}", "p0", gpus=2 + i % 2, seq=i, max_runtime_s=100.0 * (i + 1))
        ref.submit(run)
        nat.submit(run)
    assert nat.cycle(1.0) == replace(ref.cycle(1.0), pending=())  # no reasons in a cycle's
    got, want = nat.explain_all(2.0), ref.explain_all(2.0)
    assert got == want and len(got) == 2 and all(p.eta is not None for p in got)


def _explained_alike(native: Any, template: Any, steps: list[tuple[str, Any]]) -> dict[str, Any]:
    """Both engines through ``steps`` (("submit", run) or ("cycle", now)), then each explains
    at the last time: the same reasons, sentences and ETAs (by run). Returns the native ones."""
    ref, nat = FromScratch(template), NativeEngine(template, native)
    now = 0.0
    for kind, arg in steps:
        for eng in (ref, nat):
            if kind == "submit":
                eng.submit(arg)
            else:
                now = arg
                eng.cycle(arg)
    got = {p.run_id: p for p in nat.explain_all(now + 1.0)}
    assert got == {p.run_id: p for p in decide(ref.snapshot(now + 1.0)).pending}
    return got


def test_a_lender_names_the_runs_holding_what_it_lent_alike(native: Any) -> None:
    """Project a lends its 8 GPUs to b (no preemption here): a's run names b's runs, their
    ends or the lack of one, in both engines' words."""
    t = TYPES[0]
    template = make_snapshot(
        [make_node("n0", 8, t, backend="b1")],
        [
            make_project(name, cohort="org", quotas={t: Quota(n, None)})
            for name, n in (("a", 8), ("b", 0))
        ],
        now=0.0,
        preemption=False,
    )
    got = _explained_alike(
        native,
        template,
        [
            ("submit", make_run("v1", "b", gpus=4, seq=0, max_runtime_s=100.0)),
            ("submit", make_run("v2", "b", gpus=4, seq=1)),
            ("cycle", 1.0),
            ("submit", make_run("r", "a", gpus=8, seq=2, max_runtime_s=10.0)),
            ("cycle", 2.0),
        ],
    )
    r = got["r"]
    assert r.reason_code.value == "no_capacity" and r.eta is None
    assert (
        "lent: 8 a100-80gb borrowed by project b (reclaimable: v1 (ends by 101), v2 (no "
        "max_runtime))" in r.reason
    )
    # (it is the anchor: its reservation waits for v2, which has no end)
    assert r.reason.endswith("at an unknown time: it waits for runs v2, which have no max_runtime")


def test_a_reservation_of_unknown_time_is_explained_alike(native: Any) -> None:
    """A run without max_runtime holds half the node: the 8-GPU anchor's reservation has no
    time, names that run, and holds the free GPUs from a small run that would fit."""
    t = TYPES[0]
    template = make_snapshot(
        [make_node("n0", 8, t, backend="b1")],
        [make_project("p0", quotas={t: Quota(16, None)})],
        now=0.0,
        backfill=True,
    )
    got = _explained_alike(
        native,
        template,
        [
            ("submit", make_run("hold", "p0", gpus=4, seq=0)),
            ("cycle", 1.0),
            ("submit", make_run("big", "p0", gpus=8, seq=1, max_runtime_s=50.0)),
            ("submit", make_run("small", "p0", gpus=2, seq=2, max_runtime_s=5.0)),
            ("cycle", 2.0),
        ],
    )
    assert got["big"].reason.endswith(
        "reserved (EASY backfill) at an unknown time: it waits for runs hold, which have no "
        "max_runtime"
    )
    assert got["small"].reason_code.value == "reserved" and "run big" in got["small"].reason


def test_what_it_does_not_implement_is_refused_by_name(native: Any) -> None:
    nodes = [make_node("n0", 4, TYPES[0])]
    template = make_snapshot(nodes, [make_project("p0")], now=0.0)
    assert unsupported(template) is None
    # shared devices under either placement
    shared = make_snapshot([make_node("n0", 4, TYPES[0], shared=True)], [make_project("p0")])
    assert shared.policy.placement == "fragmentation" and unsupported(shared) is None
    assert unsupported(replace(shared, policy=replace(shared.policy, placement="best-fit"))) is None
    sliced = make_snapshot([make_node("n0", 4, TYPES[0], mig={"1g.10gb": ("s0",)})], [])
    assert unsupported(sliced) is None
    # MIG slices beside nodes that fragmentation-aware placement weighs (host, shared): served
    for other in (
        make_node("n1", 4, TYPES[0], cpu_milli=8000),
        make_node("n1", 4, TYPES[0], shared=True),
    ):
        mixed = make_snapshot([make_node("n0", 4, TYPES[0], mig={"1g.10gb": ("s0",)}), other], [])
        assert mixed.policy.placement == "fragmentation" and unsupported(mixed) is None
    # host CPU tracked, under either placement; a shape prior (the packing simulator's), its
    # counts whole or not, its shapes' types in any order; a count that is no count is
    # refused by both engines alike
    host = make_snapshot([make_node("n0", 4, TYPES[0], cpu_milli=8000)], [make_project("p0")])
    assert host.policy.placement == "fragmentation" and unsupported(host) is None
    assert unsupported(replace(host, policy=replace(host.policy, placement="best-fit"))) is None
    for prior in (
        {(1, 1.0, 0, 0, ()): 3.0, (2, 1.0, 0, 0, ("a", "b")): 1.0},
        {(1, 1.0, 0, 0, ()): 2.5, (1, 1.0, 0, 0, ("b", "a")): 1 / 3},
    ):
        assert unsupported(replace(host, shape_prior=prior)) is None
        NativeEngine(replace(host, shape_prior=prior), native)
    for bad in (math.nan, math.inf, -1.0):
        wrong = replace(host, shape_prior={(1, 1.0, 0, 0, ("b",)): bad})
        with pytest.raises(ValueError, match="shape_prior: the count of shape"):
            FromScratch(wrong).cycle(0.0)
        with pytest.raises(ValueError, match="shape_prior: a count must be finite"):
            NativeEngine(wrong, native)
    # every run is taken: MIG slices, and CPU-only runs (``gpus`` 0)
    eng = NativeEngine(template, native)
    eng.submit(make_run("m", "p0", mig="1g.10gb"))
    eng.submit(make_run("c", "p0", gpus=0, cpu_milli=1000))
    assert set(eng.pending) == {"m", "c"}


@pytest.mark.slow
def test_the_benchmark_digest_is_the_python_cores(native: Any) -> None:
    python, ours = core_bench("--core", "python"), core_bench("--core", "native")
    assert (python["core"], ours["core"]) == ("python", "native")
    # (949 cycles since a same-class victim must have checkpointed: the workload reports none)
    assert python["cycles"] == ours["cycles"] and python["cycles"] > 900
    assert python["preemptions"] == ours["preemptions"] > 0
    assert python["decisions_sha256"] == ours["decisions_sha256"]


#: What differs between two replays that decided alike: how long they took.
TIMING = {"decisions_per_s", "wall_s"}


@pytest.mark.parametrize(
    "policy", ["default", "fifo", "fifo-backfill", "kueue-like", "drf", "srtf-oracle", "las"]
)
def test_the_simulator_replays_alike_on_either_engine(native: Any, policy: str) -> None:
    trace = synthetic(seed=3, jobs=400, days=0.5)
    cluster = Cluster(6, 8)
    py = simulate(trace, cluster, policy, engine="reference")
    nat = simulate(trace, cluster, policy, engine="native")
    assert (py.engine, nat.engine) == ("reference", "native")
    assert nat.segments == py.segments and len(py.segments) >= 400
    assert nat.quota_violations == py.quota_violations
    want = {k: v for k, v in summarize(py).items() if k not in TIMING}
    assert {k: v for k, v in summarize(nat).items() if k not in TIMING} == want
    assert simulate(trace, cluster, policy).engine == "native"  # auto: installed, able
