"""The Philly week of BENCHMARKS.md: the jobs submitted 2017-10-09 to 2017-10-16 (12,751) on
64 nodes x 8 GPUs, under every policy of ``mlops_gpu.sim.policies`` side by side, through the
real scheduling core (``mlops_gpu.sim``).

Prints a table and the issue's acceptance checks to stderr, then one JSON object as the last
line: the object ``mlops-gpu simulate --json`` prints, with ``gap_closed`` and the ETA keys
(``sim.eta``) per policy and ``wall_s`` for the whole benchmark.

    python benchmarks/philly_week.py [--workers 2] [--days 7] [--policy NAME]...
                                     [--engine auto|reference|native]

``--engine``: the core's engine for every replay (the decisions are the same): ``native`` (Rust,
``mlops_gpu._engine``, built by the install where cargo exists) where installed,
``reference`` (the Python reference; ``python``, its former name, is accepted), or ``auto``
(default: native where installed, else the reference).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

from mlops_gpu.engines import native
from mlops_gpu.sim import Cluster, load_philly
from mlops_gpu.sim.compare import DEFAULT_POLICIES, compare

DATA = Path(__file__).resolve().parent.parent / "mlops_gpu" / "sim" / "data"
CONTENDERS = ("fifo-backfill", "kueue-like")


def checks(rows: dict[str, dict[str, Any]]) -> list[tuple[str, bool]]:
    """The acceptance list of issue 4 for this benchmark, each with whether it holds."""
    d = rows.get("default")
    if d is None:
        return []
    out = []
    for name in CONTENDERS:
        if name in rows:
            r = rows[name]
            out.append(
                (
                    f"default beats {name} on avg JCT ({d['avg_jct_s']:.0f} < "
                    f"{r['avg_jct_s']:.0f} s) and Jain ({d['jain']:.3f} > {r['jain']:.3f})",
                    d["avg_jct_s"] < r["avg_jct_s"] and d["jain"] > r["jain"],
                )
            )
    out.append((f"default Jain >= 0.95 ({d['jain']:.3f})", d["jain"] >= 0.95))
    gap = d.get("gap_closed")
    out.append(
        (
            f"default gap_closed >= 0.3 ({'n/a' if gap is None else f'{gap:.2f}'})",
            gap is not None and gap >= 0.3,
        )
    )
    out.append(
        (f"default quota violations = 0 ({d['quota_violations']})", d["quota_violations"] == 0)
    )
    cov, on_time, err = d["eta_coverage"], d["eta_on_time"], d["eta_median_rel_err"]
    out.append(
        (
            f"default ETAs (issue 29): coverage >= 0.9 ({_f(cov)}), on time >= 0.95 "
            f"({_f(on_time)}), median relative error <= 0.5 ({_f(err)})",
            cov is not None
            and cov >= 0.9
            and on_time is not None
            and on_time >= 0.95
            and err is not None
            and err <= 0.5,
        )
    )
    better = [
        p
        for p, r in rows.items()
        if p not in ("default", "srtf-oracle")
        and r["avg_jct_s"] < d["avg_jct_s"]
        and r["jain"] > d["jain"]
    ]
    out.append(
        (
            f"no policy but srtf-oracle beats default on both ({', '.join(better) or 'none'})",
            not better,
        )
    )
    return out


def _f(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="policies replayed in parallel")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--policy", action="append", dest="policies")
    ap.add_argument("--engine", choices=["auto", "reference", "native", "python"], default="auto")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.engine not in ("reference", "python") and native.installed() is None:
        if args.engine == "native":
            raise SystemExit(f"philly week: {native.PYTHON_ENGINE_WARNING}")
        print(f"philly week: {native.PYTHON_ENGINE_WARNING}", file=sys.stderr)
    trace = load_philly(
        DATA / "philly.csv.gz", DATA / "philly_vc_nodes.csv", date(2017, 10, 9), args.days, 8
    )
    cluster = Cluster(64, 8)
    print(f"philly week: {len(trace.jobs)} jobs on {cluster.gpus} GPUs", file=sys.stderr)

    def done(r: Any) -> None:
        print(f"  {r.policy}: replayed in {r.wall_s:.1f}s ({r.engine} engine)", file=sys.stderr)

    out, _ = compare(
        trace,
        cluster,
        args.policies or DEFAULT_POLICIES,
        workers=args.workers,
        done=done,
        engine=args.engine,
    )
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    rows = {r["policy"]: r for r in out["results"]}
    print(
        f"{'policy':14}{'avg JCT h':>10}{'p99 JCT h':>10}{'Jain':>7}{'gap':>7}"
        f"{'preempt':>9}{'lost GPU-h':>11}{'viol.':>7}{'wall s':>8}"
        f"{'ETA cov':>8}{'on time':>8}{'rel err':>8}",
        file=sys.stderr,
    )
    for r in out["results"]:
        gap = "-" if r["gap_closed"] is None else f"{r['gap_closed']:.2f}"
        viol = "-" if r["quota_violations"] is None else str(r["quota_violations"])
        print(
            f"{r['policy']:14}{r['avg_jct_s'] / 3600:>10.2f}{r['p99_jct_s'] / 3600:>10.2f}"
            f"{r['jain']:>7.3f}{gap:>7}{r['preemptions']:>9}{r['lost_gpu_hours']:>11.1f}"
            f"{viol:>7}{r['wall_s']:>8.1f}{_f(r['eta_coverage']):>8}{_f(r['eta_on_time']):>8}"
            f"{_f(r['eta_median_rel_err']):>8}",
            file=sys.stderr,
        )
    for text, ok in checks(rows):
        print(f"  [{'ok' if ok else 'NO'}] {text}", file=sys.stderr)
    print(f"  whole benchmark: {out['wall_s']} s (target < 120 s)", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
