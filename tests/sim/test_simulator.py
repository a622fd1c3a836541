"""The simulator runs the real core: hand-checked schedules on tiny traces, and invariants on
a seeded synthetic trace under every policy."""

from __future__ import annotations

import pytest

from mlops_gpu.sim import PRESETS, Cluster, simulate, summarize, synthetic
from mlops_gpu.sim.compare import compare
from mlops_gpu.sim.trace import Trace, TraceJob

# 2 GPUs. A (1 GPU, 100 s) at 0; B (2 GPUs, 100 s) at 1 is blocked; C (1 GPU, 10 s) at 2.
SMALL = Trace(
    "small",
    (
        TraceJob("A", 0.0, 100.0, 1, 1, "p"),
        TraceJob("B", 1.0, 100.0, 2, 1, "p"),
        TraceJob("C", 2.0, 10.0, 1, 1, "p"),
    ),
    {"p": 1.0},
)


def finish_times(policy: str) -> dict[str, float | None]:
    r = simulate(SMALL, Cluster(1, 2), policy)
    return {o.job.id: o.finish for o in r.outcomes}


def test_fifo_makes_c_wait_behind_b() -> None:
    assert finish_times("fifo") == {"A": 100.0, "B": 200.0, "C": 210.0}


def test_fifo_backfill_starts_c_in_the_hole_before_bs_reservation() -> None:
    # C's max_runtime (2 x 10 s) ends before B's reserved start (100): it backfills at 2.
    assert finish_times("fifo-backfill") == {"A": 100.0, "B": 200.0, "C": 12.0}


def test_preempted_job_keeps_its_checkpoints_and_pays_the_restart() -> None:
    # low (2 GPUs, 2 h) runs; high-priority job arrives at 3,700 s and preempts it (same pool).
    t = Trace(
        "preempt",
        (
            TraceJob("low", 0.0, 7200.0, 2, 1, "p", priority="low"),
            TraceJob("high", 3700.0, 100.0, 2, 1, "p", priority="high"),
        ),
        {"p": 1.0},
    )
    r = simulate(t, Cluster(1, 2), "default")
    out = {o.job.id: o for o in r.outcomes}
    # low checkpointed at 1,800 and 3,600 s: it loses 100 s x 2 GPUs, restarts at 3,800 with
    # 3,600 s left plus 60 s of restart: it ends at 7,460.
    assert out["low"].preempted == 1 and out["low"].lost_gpu_s == pytest.approx(200.0)
    assert out["high"].finish == 3800.0 and out["low"].finish == pytest.approx(7460.0)
    assert summarize(r)["preemptions"] == 1


@pytest.mark.parametrize("policy", sorted(PRESETS))
def test_every_policy_runs_every_job_within_capacity(policy: str) -> None:
    trace = synthetic(seed=7, jobs=150, projects=3, days=0.5)
    cluster = Cluster(8, 8)
    r = simulate(trace, cluster, policy)
    assert r.unfinished == 0
    for o in r.outcomes:
        assert o.finish is not None and o.first_start is not None
        assert o.finish - o.job.submit_s >= o.job.duration_s - 1e-6
    # never more GPUs held than the cluster has
    steps = sorted([(s, g) for _, s, _, g in r.segments] + [(e, -g) for _, _, e, g in r.segments])
    held = 0
    for _, d in sorted(steps, key=lambda x: (x[0], x[1])):
        held += d
        assert held <= cluster.gpus
    s = summarize(r)
    assert s["quota_violations"] in (0, None)
    assert 0 < s["utilization"] <= 1.0 + 1e-9
    again = summarize(simulate(trace, cluster, policy))
    assert {k: v for k, v in again.items() if k not in ("wall_s", "decisions_per_s")} == {
        k: v for k, v in s.items() if k not in ("wall_s", "decisions_per_s")
    }


# 2 GPUs. L (2 GPUs, 1 h) at 0; S (2 GPUs, 400 s) at 1,000 s, when L has 2,600 s to go.
LONG_SHORT = Trace(
    "long-short",
    (TraceJob("L", 0.0, 3600.0, 2, 1, "p"), TraceJob("S", 1000.0, 400.0, 2, 1, "p")),
    {"p": 1.0},
)


def test_srtf_oracle_preempts_a_job_with_longer_to_go() -> None:
    r = simulate(LONG_SHORT, Cluster(1, 2), "srtf-oracle")
    out = {o.job.id: o for o in r.outcomes}
    # 2,600 s left > 400 s: L is preempted at 1,000 s before any checkpoint (all 1,000 s lost),
    # S runs 1,000-1,400, L restarts with its whole hour plus 60 s of restart.
    assert out["S"].finish == 1400.0
    assert out["L"].preempted == 1 and out["L"].lost_gpu_s == pytest.approx(2000.0)
    assert out["L"].finish == pytest.approx(1400.0 + 60.0 + 3600.0)


def test_default_preempts_its_own_class_only_for_a_large_gain() -> None:
    # Estimates are 2 x: L expected 6,200 s more, S asks 800 s; 6,200 < 8 x 800: no preemption.
    r = simulate(LONG_SHORT, Cluster(1, 2), "default")
    out = {o.job.id: o for o in r.outcomes}
    assert out["L"].preempted == 0 and out["L"].finish == 3600.0
    assert out["S"].finish == 4000.0


# 2 GPUs. L (2 GPUs, 40,000 s) at 0; S (2 GPUs, 400 s) at 1,000 s: L is expected to go on for
# far more than 8 x S's 800 s, but has not checkpointed yet (its first checkpoint: 1,800 s).
NO_CHECKPOINT_YET = Trace(
    "no-checkpoint-yet",
    (TraceJob("L", 0.0, 40_000.0, 2, 1, "p"), TraceJob("S", 1000.0, 400.0, 2, 1, "p")),
    {"p": 1.0},
)


def test_default_does_not_preempt_its_own_class_before_a_checkpoint() -> None:
    r = simulate(NO_CHECKPOINT_YET, Cluster(1, 2), "default")
    out = {o.job.id: o for o in r.outcomes}
    # Not at 1,000 s (nothing saved: all would be lost); cycles run at arrivals and
    # completions, and the next one is L's end.
    assert out["L"].preempted == 0 and out["L"].lost_gpu_s == 0.0
    assert out["S"].first_start == 40_000.0 and out["S"].finish == 40_400.0


@pytest.mark.parametrize("workers", [1, 2])
def test_compare_fills_gap_closed_from_both_references(workers: int) -> None:
    out, results = compare(
        LONG_SHORT, Cluster(1, 2), ["default", "fifo-backfill", "srtf-oracle"], workers=workers
    )
    assert [r.policy for r in results] == ["default", "fifo-backfill", "srtf-oracle"]
    rows = {row["policy"]: row for row in out["results"]}
    # fifo-backfill: L 3,600, S 3,000 (avg 3,300); srtf-oracle: L 5,060, S 400 (avg 2,730)
    assert rows["fifo-backfill"]["avg_jct_s"] == pytest.approx(3300.0)
    assert rows["srtf-oracle"]["avg_jct_s"] == pytest.approx(2730.0)
    assert rows["srtf-oracle"]["gap_closed"] == pytest.approx(1.0)
    assert rows["fifo-backfill"]["gap_closed"] == pytest.approx(0.0)
    assert rows["default"]["gap_closed"] == pytest.approx(0.0)
    assert (out["nodes"], out["gpus"], out["jobs"]) == (1, 2, 2)


def test_compare_without_both_references_leaves_gap_closed_null() -> None:
    out, _ = compare(LONG_SHORT, Cluster(1, 2), ["default", "fifo-backfill"])
    assert all(row["gap_closed"] is None for row in out["results"])
