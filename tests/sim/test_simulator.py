"""The simulator runs the real core: hand-checked schedules on tiny traces, and invariants on
a seeded synthetic trace under every policy."""

from __future__ import annotations

import pytest

from mlops_gpu.sim import PRESETS, Cluster, simulate, summarize, synthetic
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
