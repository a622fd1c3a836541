"""Remembered preemption-search failures (``core.search_memo``): a failure for want of
capacity is recalled while nothing could change it, and dropped when a release makes room;
the incremental engine decides what a from-scratch cycle decides either way."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import replace
from types import MappingProxyType

import pytest

from mlops_gpu.core import decide
from mlops_gpu.core.engine import Incremental
from mlops_gpu.core.search_memo import SearchMemo
from mlops_gpu.model import Phase, Project, Quota, Run
from mlops_gpu.testing import make_node, make_run, make_snapshot
from mlops_gpu.testing.builders import placed

QUOTA = MappingProxyType({"a100-80gb": Quota(16, 0)})
PROJECTS = [Project("p", quotas=QUOTA), Project("q", quotas=QUOTA)]


def active(run_id: str, project: str, node: str, devs: list[str], **kw: object) -> Run:
    return make_run(
        run_id,
        project,
        gpus=len(devs),
        phase=Phase.RUNNING,
        placement=placed(node, devs),
        **kw,  # type: ignore[arg-type]
    )


def engine() -> Incremental:
    """n0: p's low-class run on 0-3 (a victim for p's 'big'), q's runs on 4-6, device 7 free;
    n1: q's run on all 8. 'big' (p, 8 GPUs, normal) cannot fit even with its victim gone."""
    nodes = [make_node("n0", 8), make_node("n1", 8)]
    runs = [
        active("low", "p", "n0", ["0", "1", "2", "3"], priority="low"),
        active("q-a", "q", "n0", ["4", "5"], preemptible=False),
        active("q-b", "q", "n0", ["6"], preemptible=False),
        active("q-c", "q", "n1", [str(i) for i in range(8)], preemptible=False),
    ]
    eng = Incremental(make_snapshot(nodes, PROJECTS, now=0.0))
    for r in runs:
        eng.state.add_active(r)
    eng.submit(make_run("big", "p", gpus=8, max_runtime_s=100.0))
    return eng


def cycle(eng: Incremental, now: float) -> tuple[list[str], list[str]]:
    ref = decide(eng.snapshot(now))
    got = eng.cycle(now)
    assert got.admissions == ref.admissions and got.preemptions == ref.preemptions
    return [a.run_id for a in got.admissions], [p.run_id for p in got.preemptions]


@pytest.mark.parametrize(
    ("finished", "remembered", "preempted", "admitted"),
    [
        # Nothing changed: the failure is recalled, nothing is preempted.
        pytest.param((), True, [], [], id="nothing-released-recalled"),
        # q frees n1 (no victim of p there, 8 free): 'big' simply fits and is admitted.
        pytest.param(("q-c",), False, [], ["big"], id="release-that-fits-outright"),
        # q frees 1 GPU on n0: free 2 + victim 4 < 8, still no room: recalled.
        pytest.param(("q-b",), True, [], [], id="release-without-enough-room-recalled"),
        # q frees 3 GPUs on n0: free 4 + victim 4 = 8: the search runs again, preempts, and
        # admits 'big' in the same decision.
        pytest.param(
            ("q-a", "q-b"), False, ["low"], ["big"], id="release-that-makes-room-searches"
        ),
    ],
)
def test_a_failed_search_is_recalled_until_a_release_makes_room(
    finished: tuple[str, ...], remembered: bool, preempted: list[str], admitted: list[str]
) -> None:
    eng = engine()
    assert cycle(eng, 1.0) == ([], [])
    assert "big" in eng.state.memo.entries  # failed for want of capacity: remembered
    for run_id in finished:
        eng.finish(run_id)
    assert cycle(eng, 2.0) == (admitted, preempted)
    assert ("big" in eng.state.memo.entries) is remembered


def test_a_run_leaving_the_queue_is_forgotten() -> None:
    eng = engine()
    cycle(eng, 1.0)
    eng.state.remove_pending("big")  # cancelled, or admitted
    assert "big" not in eng.state.memo.entries


def test_the_release_log_is_kept_only_while_failures_are_remembered() -> None:
    eng = engine()
    eng.finish("q-b")  # nothing remembered yet: not logged
    assert eng.state.memo.log == []
    cycle(eng, 1.0)
    eng.finish("q-a")
    assert eng.state.memo.log == [("a100-80gb", ("n0",))]


def test_a_cohort_member_starting_to_borrow_reopens_the_search() -> None:
    # p (nominal 10) and q (nominal 4) share a cohort. Cycle 1: q is within its quota, so only
    # p's own low-class run (2 GPUs) could be a victim of 'big': no room, remembered; q's
    # 'q-y' starts on the last 2 GPUs, and q borrows from then on. Cycle 2: q's runs may be
    # reclaimed, so no release happened but the search must run again (and preempts all).
    quotas = {"p": 10, "q": 4}
    projects = [
        Project(n, cohort="org", quotas=MappingProxyType({"a100-80gb": Quota(v, None)}))
        for n, v in quotas.items()
    ]
    eng = Incremental(make_snapshot([make_node("n0", 8)], projects, now=0.0, cohorts=["org"]))
    # ('q-y' ends before 'low' and 'q-x' are expected to: it may use what 'big' is reserved)
    eng.state.add_active(active("low", "p", "n0", ["0", "1"], priority="low", max_runtime_s=999.0))
    eng.state.add_active(active("q-x", "q", "n0", ["2", "3", "4", "5"], max_runtime_s=999.0))
    eng.submit(make_run("big", "p", gpus=8, max_runtime_s=100.0))
    eng.submit(make_run("q-y", "q", gpus=2, seq=1, max_runtime_s=50.0))
    assert cycle(eng, 1.0) == (["q-y"], [])
    assert "big" in eng.state.memo.entries
    assert cycle(eng, 2.0) == (["big"], ["low", "q-x", "q-y"])


def test_a_run_admitted_in_the_same_cycle_reopens_the_search_when_it_becomes_a_victim() -> None:
    # p (nominal 6) holds 'v1' (4 GPUs); 'small' (2, within nominal) is served before 'big'
    # (6, borrowing) and takes the last 2 free GPUs of n0. Within that cycle 'small' holds its
    # GPUs without being a possible victim yet: 'big' finds no room and is remembered. Once
    # 'small' is a possible victim the room is 6 with no release in between: the next cycle
    # must search again, and preempts both for 'big' (which then stays within nominal). (Same
    # class: no minimum runtime or checkpoint asked here, as 'small' ran for 1 s.)
    projects = [
        Project("p", cohort="org", quotas=MappingProxyType({"a100-80gb": Quota(6, None)})),
        Project("q", cohort="org", quotas=MappingProxyType({"a100-80gb": Quota(8, None)})),
    ]
    nodes = [make_node("n0", 8)]
    eng = Incremental(
        make_snapshot(
            nodes,
            projects,
            now=0.0,
            cohorts=["org"],
            order="shortest",
            min_runtime_before_preemption_s=0.0,
            preempt_uncheckpointed=True,
        )
    )
    eng.state.add_active(active("v1", "p", "n0", ["0", "1", "2", "3"], max_runtime_s=1000.0))
    eng.state.add_active(active("q-a", "q", "n0", ["4", "5"], preemptible=False))
    eng.submit(make_run("small", "p", gpus=2, seq=1, max_runtime_s=900.0))
    eng.submit(make_run("big", "p", gpus=6, seq=2, max_runtime_s=10.0))
    assert cycle(eng, 1.0) == (["small"], [])
    assert "big" in eng.state.memo.entries
    assert cycle(eng, 2.0) == (["big"], ["small", "v1"])


def test_the_memo_changes_no_decision_on_a_contended_cluster() -> None:
    # The set-up of benchmarks/core_throughput.py, scaled down (50 nodes of 3 types, 2,500
    # runs of 1/2/4/8 GPUs and 2-node gangs, 20 projects in 4 cohorts, order: shortest): two
    # incremental engines, one without the memo, must decide alike cycle after cycle while
    # runs finish on a virtual clock and victims queue again.
    rng = random.Random(1)
    shares = {"a100-80gb": 0.4, "h100-80gb": 0.4, "l40s-48gb": 0.2}
    types, weights = list(shares), list(shares.values())
    nodes = [make_node(f"{t}-{i}", 8, t) for t, w in shares.items() for i in range(round(50 * w))]
    quotas = MappingProxyType({t: Quota(round(400 * w) // 20, None) for t, w in shares.items()})
    projects = [Project(f"p{i:02d}", cohort=f"c{i % 4}", quotas=quotas) for i in range(20)]
    template = make_snapshot(
        nodes, projects, now=0.0, order="shortest", cohorts=[f"c{i}" for i in range(4)]
    )
    shapes = [(1, 1), (2, 1), (4, 1), (8, 1), (4, 2)]
    durations: dict[str, float] = {}
    with_memo, without = Incremental(template), Incremental(template)
    without.state.memo = SearchMemo(enabled=False)
    for k in range(2500):
        gpus, width = rng.choices(shapes, [40, 20, 15, 15, 10])[0]
        duration = math.exp(rng.uniform(math.log(600), math.log(36000)))
        run = make_run(
            f"r{k:05d}",
            f"p{rng.randrange(20):02d}",
            gpus=gpus,
            nodes=width,
            seq=k,
            gpu_types=rng.choices(types, weights),
            max_runtime_s=2 * duration,
        )
        durations[run.id] = duration
        with_memo.submit(run)
        without.submit(run)
    ends: list[tuple[float, str]] = []
    now, recalled = 0.0, 0
    for _ in range(700):
        before = len(with_memo.state.memo.entries)
        got, ref = with_memo.cycle(now), without.cycle(now)
        assert (got.admissions, got.preemptions) == (ref.admissions, ref.preemptions), now
        recalled += before > 0
        for a in got.admissions:
            heapq.heappush(ends, (now + durations[a.run_id], a.run_id))
        for p in got.preemptions:  # the victim stops at once and queues again
            for eng in (with_memo, without):
                v = eng.finish(p.run_id)
                again = replace(v, phase=Phase.PENDING, placement=None, preempt_requested=False)
                eng.submit(replace(again, attempt=v.attempt + 1))
        now, run_id = heapq.heappop(ends)
        for eng in (with_memo, without):
            if run_id in eng.active:
                eng.finish(run_id)
    assert recalled > 100  # the memo was in play, not idle


def test_a_run_being_preempted_frees_its_devices_at_a_recall() -> None:
    # Cycle 1: 'big' (p, 6 GPUs) finds no room even with p's only victim ('px' on n1) gone:
    # remembered. Then q's 'q-a' (4 GPUs on n0) is being preempted (for some other run): it
    # holds nothing from then on, n0 has 6 free, and 'big' must not be recalled as blocked.
    nodes = [make_node("n0", 8), make_node("n1", 8)]
    eng = Incremental(make_snapshot(nodes, PROJECTS, now=0.0))
    eng.state.add_active(active("q-a", "q", "n0", ["0", "1", "2", "3"]))
    eng.state.add_active(active("q-b", "q", "n0", ["4", "5"], preemptible=False))
    eng.state.add_active(active("px", "p", "n1", ["0"], priority="low"))
    eng.state.add_active(active("q-c", "q", "n1", [str(i) for i in range(1, 8)], preemptible=False))
    eng.submit(make_run("big", "p", gpus=6, max_runtime_s=100.0))
    assert cycle(eng, 1.0) == ([], [])
    assert "big" in eng.state.memo.entries
    eng.state.mark_going("q-a")
    assert cycle(eng, 2.0) == (["big"], [])
