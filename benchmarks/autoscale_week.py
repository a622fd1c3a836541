"""Elastic capacity on the Philly week of BENCHMARKS.md: the jobs submitted 2017-10-09 to
2017-10-16 on a pool of up to 64 nodes x 8 GPUs (boot 300 s, a price per node-hour), through the
real scheduling core (``mlops_gpu.sim.autoscale``, policy ``default``, ``--engine``), under three
scalers in the same run: always-on (64 nodes up throughout), the reactive baseline (boot for the
pending demand as soon as anything waits, power down after 10 min idle: cluster-autoscaler's
behaviour) and ours (``core.autoscale``). Node-hours run from the first submission to the last
event of each replay, booting included.

Prints a short table and the issue's targets to stderr, then one JSON object as the last line:
``{"rows": [{"policy", "node_hours", "cost_usd", "avg_jct_s", "p99_wait_s", "scale_ups"}], ...}``.

    python benchmarks/autoscale_week.py [--hours N] [--price 20] [--idle-s 600] [--workers 3]
        [--engine auto|reference|native]

``--hours``: only the first N hours of submissions (quick runs); the full week by default.
``--engine``: the core's engine (the same decisions either way; native where installed by
default). Each row carries its engine, its replay's wall time and its process's CPU time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

from mlops_gpu.model import Pool
from mlops_gpu.sim import load_philly
from mlops_gpu.sim.autoscale import SCALERS, simulate_pool
from mlops_gpu.sim.metrics import summarize
from mlops_gpu.sim.trace import Trace

DATA = Path(__file__).resolve().parent.parent / "mlops_gpu" / "sim" / "data"
ORDER = ("always-on", "reactive", "ours")


def _row(args: tuple[Trace, Pool, str, str]) -> dict[str, Any]:
    trace, pool, scaler, engine = args
    cpu = time.process_time()
    r = simulate_pool(trace, pool, scaler, engine=engine)
    cpu = time.process_time() - cpu
    m = summarize(r)
    return {
        "policy": scaler,
        "node_hours": round(r.extra["node_hours"], 1),
        "cost_usd": round(r.extra["cost_usd"], 2),
        "avg_jct_s": round(m["avg_jct_s"], 1),
        "p99_wait_s": round(m["p99_wait_s"], 1),
        "scale_ups": int(r.extra["scale_ups"]),
        "scale_downs": int(r.extra["scale_downs"]),
        "unfinished": m["unfinished"],
        "wall_s": round(r.wall_s, 1),
        "cpu_s": round(cpu, 1),
        "engine": r.engine,
    }


def checks(rows: dict[str, dict[str, Any]]) -> list[tuple[str, bool]]:
    """The issue's targets, each with whether it holds."""
    on, re, us = rows["always-on"], rows["reactive"], rows["ours"]
    cost = us["cost_usd"] / on["cost_usd"]
    jct = us["avg_jct_s"] / on["avg_jct_s"]
    beats = (us["cost_usd"] < re["cost_usd"] and us["avg_jct_s"] <= re["avg_jct_s"]) or (
        us["avg_jct_s"] < re["avg_jct_s"] and us["cost_usd"] <= re["cost_usd"]
    )
    return [
        (f"ours costs <= 0.5 x always-on ({cost:.3f} x)", cost <= 0.5),
        (f"ours avg JCT <= 1.10 x always-on ({jct:.3f} x)", jct <= 1.10),
        (
            f"ours beats reactive on cost at equal or lower avg JCT, or on avg JCT at equal or "
            f"lower cost (cost {us['cost_usd']:.0f} vs {re['cost_usd']:.0f} $, avg JCT "
            f"{us['avg_jct_s']:.0f} vs {re['avg_jct_s']:.0f} s)",
            beats,
        ),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=None, help="first N hours of submissions")
    ap.add_argument("--price", type=float, default=20.0, help="USD per node-hour")
    ap.add_argument("--idle-s", type=float, default=600.0, help="ours: the pool's idle_s")
    ap.add_argument("--workers", type=int, default=3, help="replays run in parallel")
    ap.add_argument(
        "--engine",
        choices=("auto", "reference", "native", "python"),
        default="auto",
        help="the core's engine (python: the reference's former name)",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    days = 7.0 if args.hours is None else args.hours / 24
    trace = load_philly(
        DATA / "philly.csv.gz", DATA / "philly_vc_nodes.csv", date(2017, 10, 9), days, 8
    )
    pool = Pool("philly", "sim", "gpu", 8, 0, 64, 300.0, args.price, args.idle_s)
    print(
        f"autoscale week: {len(trace.jobs)} jobs on up to 64 x 8 GPUs, boot 300 s, "
        f"${args.price:g}/node-hour",
        file=sys.stderr,
    )
    assert set(ORDER) == set(SCALERS)
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as ex:
        rows = list(ex.map(_row, [(trace, pool, s, args.engine) for s in ORDER]))
    print(
        f"{'policy':10}{'node-h':>9}{'cost $':>10}{'avg JCT s':>11}{'p99 wait s':>12}"
        f"{'ups':>6}{'downs':>7}{'wall s':>8}{'cpu s':>8}  engine",
        file=sys.stderr,
    )
    for r in rows:
        print(
            f"{r['policy']:10}{r['node_hours']:>9.0f}{r['cost_usd']:>10.0f}{r['avg_jct_s']:>11.0f}"
            f"{r['p99_wait_s']:>12.0f}{r['scale_ups']:>6}{r['scale_downs']:>7}{r['wall_s']:>8.1f}"
            f"{r['cpu_s']:>8.1f}  {r['engine']}",
            file=sys.stderr,
        )
    for text, ok in checks({r["policy"]: r for r in rows}):
        print(f"  [{'ok' if ok else 'NO'}] {text}", file=sys.stderr)
    out = {
        "rows": rows,
        "jobs": len(trace.jobs),
        "hours": args.hours,
        "price_per_node_hour": args.price,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
