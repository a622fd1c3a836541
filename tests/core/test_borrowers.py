"""Shortest-first preemption across projects (``policy.shortest_preempt_borrowers``,
``core.borrowers``): a short run takes a long run of another project of its cohort that borrows,
when that project's fair share is above its own; never one within its project's nominal quota,
never one of a project below the preemptor's share, and under the Day-one rules (a checkpoint
reported, the minimum runtime run). A property test: quotas are never exceeded."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops_gpu.config import ConfigError, load_config
from mlops_gpu.core import ReasonCode as RC
from mlops_gpu.core import Snapshot, decide
from mlops_gpu.core.quota import cohort_roots
from mlops_gpu.engines.native import unsupported
from mlops_gpu.model import Phase, PolicySettings, Quota
from mlops_gpu.testing import config_yaml, make_node, make_project, make_run, make_snapshot
from mlops_gpu.testing.builders import placed
from tests.core.cases import A100, Case, busy, check, native_decides

ORG = "org"
ON = {"shortest_preempt_borrowers": True}
HOUR = 3600.0


def _world(
    a_nominal: int = 0,
    b_nominal: int = 1,
    *,
    history: dict[tuple[str, str], float] | None = None,
    b_runs: int = 4,
    s_gpus: int = 1,
    long_s: float = 100_000.0,
    checkpoint: float | None = 500.0,
    started: float = 0.0,
    **policy: object,
) -> Snapshot:
    """One node of 4 GPUs. Project b runs ``b_runs`` 1-GPU runs of ``long_s`` s; project c
    lends its idle nominal (the rest of the 4); a's run ``s`` asks for ``s_gpus`` GPUs for
    100 s."""
    c_nominal = 4 - a_nominal - b_nominal
    projects = [
        make_project("a", a_nominal, None, cohort=ORG),
        make_project("b", b_nominal, None, cohort=ORG),
        make_project("c", c_nominal, None, cohort=ORG),
    ]
    active = [
        busy(
            f"b{i}",
            "b",
            "n1",
            [str(i)],
            max_runtime_s=long_s,
            started_at=started,
            last_checkpoint_at=checkpoint if checkpoint is None else checkpoint + i,
        )
        for i in range(b_runs)
    ]
    pending = [make_run("s", "a", gpus=s_gpus, max_runtime_s=100.0)]
    return make_snapshot(
        [make_node("n1", 4)],
        projects,
        pending,
        active,  # type: ignore[arg-type]
        now=1000.0,
        usage_history=history,
        **{**ON, **policy},
    )


def _two_borrowers() -> Snapshot:
    """One node of 4 GPUs: b and d (nominal 0) each run two long 1-GPU runs on c's lent
    nominal; d's checkpoints are later (its runs lose less); b held a GPU for the last hour."""
    projects = [
        make_project("a", 0, None, cohort=ORG),
        make_project("b", 0, None, cohort=ORG),
        make_project("c", 4, None, cohort=ORG),
        make_project("d", 0, None, cohort=ORG),
    ]
    active = [
        busy(
            f"{p}{i}",
            p,
            "n1",
            [str(i)],
            max_runtime_s=100_000.0,
            started_at=0.0,
            last_checkpoint_at=500.0 + i if p == "b" else 900.0,
        )
        for p, i in (("b", 0), ("b", 1), ("d", 2), ("d", 3))
    ]
    return make_snapshot(
        [make_node("n1", 4)],
        projects,
        [make_run("s", "a", gpus=1, max_runtime_s=100.0)],
        active,  # type: ignore[arg-type]
        now=1000.0,
        usage_history={("b", A100): HOUR},
        **ON,
    )


CASES = {
    # b borrows c's 3 idle GPUs (share 1); a (share 0) would borrow too, so this is no
    # reclaim: only the new rule takes one of b's runs (the latest checkpoint: b3), and b's
    # share without it (3/4) stays above a's with s (1/4)
    "a-borrower-of-a-higher-share-is-taken": Case(_world(), admit={"s": "n1"}, preempt={"b3"}),
    "off-by-default-it-waits": Case(
        _world(shortest_preempt_borrowers=False), codes={"s": RC.QUOTA}
    ),
    # b holds exactly its nominal (4 of 4): it borrows nothing, so none of its runs is taken
    "a-run-within-its-projects-nominal-is-not-taken": Case(
        _world(b_nominal=4), codes={"s": RC.QUOTA}
    ),
    # a ran 4 GPUs for hours lately: its share is far above b's
    "a-project-below-the-preemptors-share-is-not-taken": Case(
        _world(history={("a", A100): 4 * HOUR * HOUR}), codes={"s": RC.QUOTA}
    ),
    # a held 2 GPUs lately (share 1/2, below b's 1), but the move would leave both at 3/4
    "a-move-that-would-not-keep-the-order-of-shares-is-not-made": Case(
        _world(history={("a", A100): 2 * HOUR}), codes={"s": RC.QUOTA}
    ),
    # each of two victims alone passes (b without one: 3/4, a with s: 2/4), the plan does not
    # (b without both: 2/4)
    "a-plan-that-would-level-the-shares-is-not-made": Case(_world(s_gpus=2), codes={"s": RC.QUOTA}),
    # a's share with s: (1/4 + 1) / 4 (a quarter hour of 1 GPU lately, weight 1); b's without
    # one run: 3/4: above 2x but not 4x
    "a-share-ratio-met-takes-it": Case(
        _world(history={("a", A100): HOUR / 4}, borrower_share_ratio=2.0),
        admit={"s": "n1"},
        preempt={"b3"},
    ),
    "a-share-ratio-not-met-takes-nothing": Case(
        _world(history={("a", A100): HOUR / 4}, borrower_share_ratio=4.0),
        codes={"s": RC.QUOTA},
    ),
    # the Day-one rules: a checkpoint reported, the minimum runtime run
    "an-uncheckpointed-borrower-is-not-taken": Case(_world(checkpoint=None), codes={"s": RC.QUOTA}),
    "a-borrower-inside-its-minimum-runtime-is-not-taken": Case(
        _world(started=600.0, checkpoint=700.0), codes={"s": RC.QUOTA}
    ),
    # 99,000 s to go is not more than a ratio of 1,000 x 100 s
    "a-borrower-not-long-enough-is-not-taken": Case(
        _world(shortest_preempt_ratio=1000.0), codes={"s": RC.QUOTA}
    ),
    # b and d borrow 2 GPUs each; b also held one lately (share 3/4, d's 2/4): d's runs lose
    # less work (later checkpoints) but d without one (1/4) would not stay above a with s
    # (1/4), so the rule takes one of b's
    "of-two-borrowers-only-the-one-staying-above-is-taken": Case(
        _two_borrowers(), admit={"s": "n1"}, preempt={"b1"}
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_cross_project_shortest_preemption(case: Case) -> None:
    check(case)


def test_the_victim_is_told_why() -> None:
    (p,) = decide(_world()).preemptions
    assert p.run_id == "b3" and p.for_run == "s"
    assert "shortest first across projects: project b was borrowing" in p.reason


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_native_engine_decides_each_case_alike(native_module: ModuleType, case: Case) -> None:
    """The Rust engine serves the setting (``native/src/preempt/borrowers.rs``): on each case
    it admits, places and preempts as ``decide`` (the victims' messages with the shares too),
    and explains every pending run alike (codes, sentences, ETAs)."""
    assert unsupported(case.snap) is None
    native_decides(native_module, case.snap)


@st.composite
def crowded(draw: st.DrawFn) -> Snapshot:
    """A full cluster of one cohort: long runs of borrowing projects, short ones queued; an
    idle member (``lender``) lends most of the cohort's nominal quota, so the others borrow."""
    n_nodes = draw(st.integers(1, 3))
    nodes = [make_node(f"n{i}", 4) for i in range(n_nodes)]
    projects = [
        make_project(
            f"p{i}",
            cohort=draw(st.sampled_from([ORG, ORG, ORG, None])),
            quotas={
                A100: Quota(
                    draw(st.integers(0, 2)),
                    draw(st.one_of(st.none(), st.none(), st.integers(0, 4))),
                    draw(st.one_of(st.none(), st.none(), st.integers(0, 4))),
                )
            },
        )
        for i in range(draw(st.integers(2, 4)))
    ]
    lender = make_project("lender", 4 * n_nodes, None, cohort=ORG)
    active = []
    for n in nodes:
        dev = 0
        while dev < 4:
            k = draw(st.integers(1, 4 - dev))
            active.append(
                make_run(
                    f"{n.name}-{dev}",
                    draw(st.sampled_from(projects)).name,
                    gpus=k,
                    phase=Phase.RUNNING,
                    placement=placed(n.name, [str(d) for d in range(dev, dev + k)], A100),
                    started_at=draw(st.sampled_from([0.0, 0.0, 900.0])),
                    last_checkpoint_at=draw(st.sampled_from([None, 100.0, 950.0])),
                    max_runtime_s=draw(st.sampled_from([None, 500.0, 50_000.0, 50_000.0])),
                    priority=draw(st.sampled_from(["normal", "normal", "normal", "low"])),
                )
            )
            dev += k
    pending = [
        make_run(
            f"r{i}",
            draw(st.sampled_from(projects)).name,
            gpus=draw(st.integers(1, 4)),
            seq=i,
            max_runtime_s=draw(st.sampled_from([None, 60.0, 60.0, 600.0, 6000.0])),
            priority=draw(st.sampled_from(["normal", "normal", "normal", "high"])),
        )
        for i in range(draw(st.integers(1, 8)))
    ]
    return make_snapshot(
        nodes,
        [*projects, lender],
        pending,
        active,
        now=1000.0,
        shortest_preempt_borrowers=True,
        shortest_preempt_ratio=draw(st.sampled_from([1.0, 2.0, 8.0])),
        borrower_share_ratio=draw(st.sampled_from([1.0, 2.0])),
        min_runtime_before_preemption_s=draw(st.sampled_from([0.0, 600.0])),
        usage_history={(p.name, A100): draw(st.floats(0, 20_000)) for p in projects},
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded())
def test_quotas_are_never_exceeded(snap: Snapshot) -> None:
    """With the rule on, a decision that raises a project's usage keeps it within nominal +
    borrowing limit, and one that raises a cohort's usage keeps it within the members' nominal
    quotas (borrowing only lends what is idle); every victim taken across projects borrowed."""
    d = decide(snap)
    victims = {p.run_id for p in d.preemptions}
    before: dict[str, float] = defaultdict(float)
    after: dict[str, float] = defaultdict(float)
    for r in snap.active:
        assert r.placement is not None
        before[r.project] += r.placement.gpu_amount
        if r.id not in victims:
            after[r.project] += r.placement.gpu_amount
    project_of = {r.id: r.project for r in snap.pending}
    for a in d.admissions:
        after[project_of[a.run_id]] += a.placement.gpu_amount
    for name, amount in after.items():
        q = snap.projects[name].quota(A100)
        if amount > before[name] + 1e-9:
            limit = q.nominal + (q.borrowing_limit if q.borrowing_limit is not None else 1e9)
            assert amount <= limit + 1e-9, (name, amount)
    roots = cohort_roots(snap)
    members: dict[str, list[str]] = defaultdict(list)
    for name in snap.projects:
        members[roots[name] or name].append(name)
    for group in members.values():
        total_before = sum(before[m] for m in group)
        total_after = sum(after[m] for m in group)
        nominal = sum(snap.projects[m].quota(A100).nominal for m in group)
        if total_after > total_before + 1e-9:
            assert total_after <= nominal + 1e-9, (group, total_after, nominal)
    active = {r.id: r for r in snap.active}
    pending = {r.id: r for r in snap.pending}
    for p in d.preemptions:
        v, run = active[p.run_id], pending[p.for_run]
        if v.project != run.project:
            assert roots[v.project] is not None and roots[v.project] == roots[run.project]
            assert before[v.project] > snap.projects[v.project].quota(A100).nominal
    assert decide(replace(snap)) == d


def test_the_config_reads_the_settings(tmp_path: Path) -> None:
    good = config_yaml(
        extra={"policy": {"shortest_preempt_borrowers": True, "borrower_share_ratio": 1.5}}
    )
    (tmp_path / "ok.yaml").write_text(good)
    p = load_config(tmp_path / "ok.yaml").policy_settings()
    assert p.shortest_preempt_borrowers and p.borrower_share_ratio == 1.5
    assert not load_config_text(tmp_path, config_yaml()).shortest_preempt_borrowers
    bad = config_yaml(extra={"policy": {"borrower_share_ratio": 0.5}})
    with pytest.raises(ConfigError, match="borrower_share_ratio"):
        load_config_text(tmp_path, bad)


def load_config_text(tmp_path: Path, text: str) -> PolicySettings:
    (tmp_path / "c.yaml").write_text(text)
    return load_config(tmp_path / "c.yaml").policy_settings()
