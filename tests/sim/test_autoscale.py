"""The simulator on an elastic pool (``sim.autoscale``): hand-checked boots, idle power-downs
and bills on tiny traces, and the invariants of every scaler on a seeded synthetic trace."""

from __future__ import annotations

import pytest

from mlops_gpu.model import Pool
from mlops_gpu.sim import synthetic
from mlops_gpu.sim.autoscale import SCALERS, compare_scalers, simulate_pool
from mlops_gpu.sim.trace import Trace, TraceJob

# one 8-GPU job of 1 h at 0, another at 2 h: a pool of at most 2 nodes that boots in 5 min
TWO = Trace(
    "two",
    (TraceJob("A", 0.0, 3600.0, 8, 1, "p"), TraceJob("B", 7200.0, 3600.0, 8, 1, "p")),
    {"p": 1.0},
)


def pool(**kw: float) -> Pool:
    base = dict(min_nodes=0, max_nodes=2, boot_s=300.0, price=10.0, idle_s=600.0)
    base.update(kw)
    return Pool(
        "p",
        "sim",
        "gpu",
        8,
        int(base["min_nodes"]),
        int(base["max_nodes"]),
        base["boot_s"],
        base["price"],
        base["idle_s"],
    )


def starts(r: object) -> dict[str, tuple[float | None, float | None]]:
    return {o.job.id: (o.first_start, o.finish) for o in r.outcomes}  # type: ignore[attr-defined]


def test_ours_boots_for_each_job_and_lets_the_node_go_after_idle_s() -> None:
    r = simulate_pool(TWO, pool(), "ours")
    # A waits for a boot (300 s), runs 1 h; the node idles 600 s and goes; B the same.
    assert starts(r) == {"A": (300.0, 3900.0), "B": (7500.0, 11100.0)}
    assert r.extra["scale_ups"] == 2 and r.extra["scale_downs"] == 2
    # billed from each boot to its power-down: 2 x (300 + 3600 + 600) s
    assert r.extra["node_hours"] == pytest.approx(2 * 4500 / 3600)
    assert r.extra["cost_usd"] == pytest.approx(10 * 2 * 4500 / 3600)


def test_a_node_idle_less_than_idle_s_serves_the_next_job_without_a_boot() -> None:
    r = simulate_pool(TWO, pool(idle_s=7200.0), "ours")
    assert starts(r) == {"A": (300.0, 3900.0), "B": (7200.0, 10800.0)}
    assert r.extra["scale_ups"] == 1 and r.extra["scale_downs"] == 1
    # billed from 0 until idle_s after B's end, when it goes
    assert r.extra["node_hours"] == pytest.approx((10800 + 7200) / 3600)


def test_min_nodes_are_up_from_the_start_and_never_go() -> None:
    r = simulate_pool(TWO, pool(min_nodes=1), "ours")
    assert starts(r) == {"A": (0.0, 3600.0), "B": (7200.0, 10800.0)}
    assert r.extra["scale_ups"] == 0 and r.extra["scale_downs"] == 0


def test_always_on_bills_every_node_for_the_whole_replay() -> None:
    r = simulate_pool(TWO, pool(), "always-on")
    assert starts(r) == {"A": (0.0, 3600.0), "B": (7200.0, 10800.0)}
    assert r.extra["node_hours"] == pytest.approx(2 * 10800 / 3600)


def test_reactive_boots_for_the_pending_demand() -> None:
    t = Trace("burst", tuple(TraceJob(f"J{i}", 0.0, 600.0, 4, 1, "p") for i in range(4)), {})
    r = simulate_pool(t, pool(), "reactive")
    assert r.extra["scale_ups"] == 2  # 16 GPUs wait: two 8-GPU nodes at once
    assert all(s == 300.0 for s, _ in starts(r).values())


def test_every_scaler_finishes_every_job_within_max_nodes() -> None:
    trace = synthetic(seed=3, days=0.05, gpus_per_node=8)
    trace = Trace(trace.name, trace.jobs[:150], trace.weights)
    out = compare_scalers(trace, pool(max_nodes=4))
    assert [row["scaler"] for row in out["results"]] == list(SCALERS)
    for row in out["results"]:
        assert row["unfinished"] == 0
        assert row["scale_ups"] >= row["scale_downs"]
        assert row["node_hours"] > 0 and row["cost_usd"] == pytest.approx(10 * row["node_hours"])
    on = next(r for r in out["results"] if r["scaler"] == "always-on")
    assert all(r["node_hours"] <= on["node_hours"] + 1e-6 for r in out["results"])


def test_each_scaler_replays_alike_on_either_engine(native_module: object) -> None:
    """The native engine rebuilt around the up nodes (``NativeEngine.set_nodes``) decides as
    the Python one: the same rows, bills and per-job starts for every scaler."""
    trace = synthetic(seed=5, days=0.05, gpus_per_node=8)
    trace = Trace(trace.name, trace.jobs[:150], trace.weights)
    for scaler in SCALERS:
        py = simulate_pool(trace, pool(max_nodes=4), scaler, engine="reference")
        nat = simulate_pool(trace, pool(max_nodes=4), scaler, engine="native")
        assert (py.engine, nat.engine) == ("reference", "native")
        assert starts(nat) == starts(py), scaler
        assert nat.extra == py.extra, scaler
    assert simulate_pool(TWO, pool(), "ours").engine == "native"  # auto: installed
