"""Metrics on tiny hand-computed cases: water-filling, Jain's index and its windows, JCT, wait,
utilization, gap closed."""

from __future__ import annotations

import pytest

from mlops_gpu.sim.metrics import (
    fairness,
    gap_closed,
    jain_index,
    percentile,
    summarize,
    water_fill,
)
from mlops_gpu.sim.simulator import Cluster, JobOutcome, SimResult
from mlops_gpu.sim.trace import Trace, TraceJob


@pytest.mark.parametrize(
    ("demand", "weight", "want"),
    [
        ({"a": 8, "b": 8}, {"a": 1, "b": 1}, {"a": 5, "b": 5}),
        ({"a": 8, "b": 8}, {"a": 3, "b": 1}, {"a": 7.5, "b": 2.5}),
        ({"a": 2, "b": 8}, {"a": 1, "b": 1}, {"a": 2, "b": 8}),
        ({"a": 6, "b": 6, "c": 1}, {"a": 1, "b": 1, "c": 1}, {"a": 4.5, "b": 4.5, "c": 1}),
        ({"a": 8, "b": 8}, {"a": 1, "b": 0}, {"a": 8, "b": 0}),
    ],
    ids=["equal", "weighted", "capped-by-demand", "leftover-refilled", "zero-weight-gets-none"],
)
def test_water_fill(demand: dict, weight: dict, want: dict) -> None:  # type: ignore[type-arg]
    got = water_fill(10.0, demand, weight)
    assert got == pytest.approx(want)


def test_jain_and_percentile() -> None:
    assert jain_index([1, 1, 1]) == 1.0
    assert jain_index([1, 0]) == 0.5
    assert jain_index([2, 1]) == pytest.approx(9 / 10)
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile([5, 1, 3, 2, 4], 99) == 5


def _result(segments: list[tuple[str, float, float, int]], outcomes: list[JobOutcome]) -> SimResult:
    jobs = tuple(o.job for o in outcomes)
    return SimResult(
        policy="p",
        trace=Trace("t", jobs, {"a": 1, "b": 1}),
        cluster=Cluster(1, 2),
        nominal={"a": 1, "b": 1},
        outcomes=outcomes,
        segments=segments,
        quota_violations=0,
        cycles=4,
        cycle_wall_s=0.5,
        wall_s=1.0,
    )


def test_one_congested_window_where_a_takes_everything() -> None:
    # 2 GPUs. a1 and b1 (2 GPUs, 1 h each) both arrive at 0; a1 runs first, then b1.
    a1 = TraceJob("a1", 0.0, 3600.0, 2, 1, "a")
    b1 = TraceJob("b1", 0.0, 3600.0, 2, 1, "b")
    r = _result(
        [("a", 0.0, 3600.0, 2), ("b", 3600.0, 7200.0, 2)],
        [JobOutcome(a1, 0.0, 3600.0, 1), JobOutcome(b1, 3600.0, 7200.0, 1)],
    )
    # Window 1: demand 4 GPU-h > 2 GPU-h, both ask; fair 1 GPU-h each; x = (2, 0): Jain 0.5.
    # Window 2: only b asks: not congested.
    assert fairness(r) == (0.5, 1)
    s = summarize(r)
    assert s["avg_jct_s"] == 5400.0 and s["avg_wait_s"] == 1800.0 and s["p99_wait_s"] == 3600.0
    assert s["avg_slowdown"] == 1.5 and s["makespan_s"] == 7200.0
    assert s["utilization"] == 1.0 and s["utilization_bound"] == 1.0
    assert s["decisions_per_s"] == 8.0 and s["jain_windows"] == 1


def test_sharing_evenly_is_fair() -> None:
    a1 = TraceJob("a1", 0.0, 7200.0, 1, 1, "a")
    b1 = TraceJob("b1", 0.0, 7200.0, 1, 1, "b")
    b2 = TraceJob("b2", 0.0, 7200.0, 1, 1, "b")  # b asks for more than its share: congested
    r = _result(
        [("a", 0.0, 7200.0, 1), ("b", 0.0, 7200.0, 1), ("b", 7200.0, 14400.0, 1)],
        [
            JobOutcome(a1, 0.0, 7200.0, 1),
            JobOutcome(b1, 0.0, 7200.0, 1),
            JobOutcome(b2, 7200.0, 14400.0, 1),
        ],
    )
    jain, windows = fairness(r)
    assert (jain, windows) == (1.0, 2)  # hours 1-2 congested and even; hours 3-4 only b asks


def test_gap_closed() -> None:
    jct = {"fifo-backfill": 10000.0, "srtf-oracle": 6000.0, "default": 8000.0}
    assert gap_closed(jct, "default") == 0.5
    assert gap_closed({"default": 1.0}, "default") is None
