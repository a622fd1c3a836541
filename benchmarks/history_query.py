"""``mlops-gpu history``'s store read (``state.history.finished_runs``) on a store with many
finished runs, with the ``ix_runs_finished`` index (schema v10) and, as the baseline in the
same run, without it (the index dropped): the default query (the last day, 100 runs) and a
filtered one (one user, the last 7 days).

    python benchmarks/history_query.py [--runs 100000] [--days 90] [--url URL]

Prints a short table and, last, one JSON line. ``--url``: a PostgreSQL URL (its mlops-gpu
tables are dropped first); default a SQLite file in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from mlops_gpu.model import RunSpec
from mlops_gpu.state import Store
from mlops_gpu.state.history import finished_runs

NOW = 2_000_000_000.0


def build(store: Store, n: int, days: int) -> None:
    """``n`` finished runs of 10 users, ending uniformly over the last ``days`` days."""
    batch = 5000
    for i in range(0, n, batch):
        specs = [
            RunSpec(name=f"run-{j}", project=f"p{j % 5}", user=f"u{j % 10}", command=("true",))
            for j in range(i, min(n, i + batch))
        ]
        store.submit_many(specs, now=NOW - days * 86400)
    span = days * 86400
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE runs SET phase = 'succeeded', exit_code = 0, "
                "finished_at = :now - ((seq * 7919) % :span), "
                "started_at = :now - ((seq * 7919) % :span) - 600"
            ),
            {"now": NOW, "span": span},
        )


def timed(fn: Any, repeat: int = 7) -> tuple[float, int]:
    """(median milliseconds, rows) of ``fn()``."""
    out, times = 0, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = len(fn())
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def measure(store: Store) -> dict[str, tuple[float, int]]:
    day = finished_runs
    return {
        "last day, 100": timed(lambda: day(store, since=NOW - 86400, limit=100)),
        "u3, 7 days, 100": timed(lambda: day(store, since=NOW - 7 * 86400, user="u3", limit=100)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--days", type=int, default=90)
    ap.add_argument("--url", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        url = a.url or f"sqlite:///{Path(d) / 'state.db'}"
        if a.url:
            with Store(url).engine.begin() as conn:
                for t in ("runs", "events", "usage", "schema_version", "revision"):
                    conn.execute(text(f"DROP TABLE IF EXISTS {t} CASCADE"))
        store = Store(url)
        t0 = time.perf_counter()
        build(store, a.runs, a.days)
        built_s = time.perf_counter() - t0
        analyze = "ANALYZE" if store.dialect == "sqlite" else "ANALYZE runs"
        with store.engine.begin() as conn:
            conn.execute(text(analyze))
        with_index = measure(store)
        with store.engine.begin() as conn:
            conn.execute(text("DROP INDEX ix_runs_finished"))
            conn.execute(text(analyze))
        without = measure(store)
        store.close()
    print(f"{a.runs} finished runs over {a.days} days ({store.dialect}; built in {built_s:.1f} s)")
    print(f"{'query':<18} {'rows':>5} {'index ms':>9} {'no index ms':>12}")
    for k, (ms, rows) in with_index.items():
        print(f"{k:<18} {rows:>5} {ms:>9.2f} {without[k][0]:>12.2f}")
    print(json.dumps({
        "bench": "history_query", "runs": a.runs, "days": a.days, "dialect": store.dialect,
        "with_index_ms": {k: round(v[0], 3) for k, v in with_index.items()},
        "without_index_ms": {k: round(v[0], 3) for k, v in without.items()},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
