"""ETA accuracy (``sim.eta``): the metrics on hand-made records, and what the simulator
records on a tiny hand-checked trace."""

from __future__ import annotations

import pytest

from mlops_gpu.sim import Cluster, simulate, summarize
from mlops_gpu.sim.eta import EtaLog, EtaRecord, eta_metrics
from mlops_gpu.sim.trace import Trace, TraceJob

# 2 GPUs. A (1 GPU, 100 s) at 0 runs; B (2 GPUs, 100 s) at 1 and C (1 GPU, 10 s) at 2 wait.
SMALL = Trace(
    "small",
    (
        TraceJob("A", 0.0, 100.0, 1, 1, "p"),
        TraceJob("B", 1.0, 100.0, 2, 1, "p"),
        TraceJob("C", 2.0, 10.0, 1, 1, "p"),
    ),
    {"p": 1.0},
)


def test_metrics_by_hand() -> None:
    records = {
        # told 1,000 at 0, started at 500: on time, |500 - 1000| / 1000
        "a": EtaRecord(0.0, 1000.0),
        # told 100 at 0, started at 400: late, |400 - 100| / 100
        "b": EtaRecord(0.0, 100.0),
        # told "now" at 10 (ETA == pending time), started at 40: on time (within 60 s), and
        # its error is measured against a one-minute wait: 30 / 60
        "c": EtaRecord(10.0, 10.0),
        # no ETA: counts against coverage only
        "d": EtaRecord(0.0, None),
    }
    got = eta_metrics(records, {"a": 500.0, "b": 400.0, "c": 40.0, "d": 50.0})
    assert got["eta_waiting"] == 4
    assert got["eta_coverage"] == pytest.approx(3 / 4)
    assert got["eta_on_time"] == pytest.approx(2 / 3)
    assert got["eta_median_rel_err"] == pytest.approx(0.5)  # of 0.5, 3.0, 0.5
    # real / told waits, each floored at 60 s: 500 / 1000, 400 / 100, 60 / 60
    assert got["eta_median_wait_ratio"] == pytest.approx(1.0)
    assert eta_metrics({}, {}) == {
        "eta_waiting": 0,
        "eta_coverage": None,
        "eta_on_time": None,
        "eta_median_rel_err": None,
        "eta_median_wait_ratio": None,
        "eta_hourly_median_rel_err": None,
    }


def test_a_run_that_never_started_is_late_and_left_out_of_the_error() -> None:
    got = eta_metrics({"a": EtaRecord(0.0, 100.0), "b": EtaRecord(0.0, 100.0)}, {"a": 100.0})
    assert got["eta_on_time"] == 0.5 and got["eta_median_rel_err"] == 0.0


def test_log_samples_every_hour_while_a_run_waits() -> None:
    log = EtaLog()

    class R:
        def __init__(self, rid: str, eta: float | None) -> None:
            self.run_id, self.eta = rid, eta

    assert log.due(10.0, ["a"])
    log.record(10.0, ["a"], [R("a", 5000.0)])
    assert not log.due(3599.0, [])
    assert log.due(3700.0, [])
    log.record(3700.0, [], [R("a", 4000.0)])
    log.started("a")
    assert not log.due(7300.0, [])
    assert log.records["a"] == EtaRecord(10.0, 5000.0, [(3700.0, 4000.0)])


def test_fifo_on_the_small_trace() -> None:
    # B waits for A, whose max_runtime (2 x 100 s) ends at 200: told 200, started at 100.
    # C waits behind B under strict FIFO: B is booked at 200 for its max_runtime (200 s), so
    # C is told 400 and starts at 200.
    r = simulate(SMALL, Cluster(1, 2), "fifo")
    assert r.etas == {"B": EtaRecord(1.0, 200.0), "C": EtaRecord(2.0, 400.0)}
    row = summarize(r)
    assert row["eta_coverage"] == 1.0 and row["eta_on_time"] == 1.0
    # |100 - 200| / 199 and |200 - 400| / 398
    assert row["eta_median_rel_err"] == pytest.approx(100 / 199)


def test_default_on_the_small_trace() -> None:
    # Under default, B waits for quota (its project's cohort has nothing to lend) and GPUs:
    # both come back when A ends by its max_runtime, at 200.
    r = simulate(SMALL, Cluster(1, 2), "default")
    assert r.etas == {"B": EtaRecord(1.0, 200.0)}
    row = summarize(r)
    assert (row["eta_waiting"], row["eta_coverage"], row["eta_on_time"]) == (1, 1.0, 1.0)
