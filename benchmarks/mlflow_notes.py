"""The store's record of attempts' MLflow runs (``state.mlflow_notes``, table ``mlflow_runs``)
against the form it replaced (the MLflow run id in the text of an event), on SQLite.

Measures, in process CPU time (``time.process_time``: on a shared machine the wall time is
mostly waiting for a core), over a store of ``--runs`` runs, each with one attempt's MLflow run
noted and most closed:
- ``tick_ms``: one tick's ``opened`` notes for ``--batch`` launches, one transaction
  (``Store.note_mlflow``); baseline ``tick_events_ms``: the same count of events in one
  transaction (``Store.note_many``, what a tick wrote before);
- ``close_ms``: the tracking worker's ``closed`` notes for ``--batch`` attempts (one round);
- ``recover_ms``: a start's read of the attempts over and not closed (``unclosed``);
- ``migrate_ms``: the v12 step over the same runs written the old way (events), at open.

Prints a short table, then one JSON line (last).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import update

from mlops_gpu.model import ACTIVE_PHASES, RunSpec
from mlops_gpu.state.mlflow_notes import MlflowNote
from mlops_gpu.state.schema import events, mlflow_runs, runs, schema_version
from mlops_gpu.state.store import Store
from mlops_gpu.testing import make_spec


def cpu_ms(fn: Callable[[], object], repeat: int) -> float:
    """The median CPU time of ``fn`` over ``repeat`` calls, in ms."""
    out = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        out.append(1000 * (time.process_time() - t0))
    return statistics.median(out)


def build(path: Path, n: int) -> tuple[Store, list[str]]:
    store = Store(f"sqlite:///{path}")
    specs: list[RunSpec] = [make_spec(name=f"j{i}") for i in range(n)]
    ids = [r.id for r in store.submit_many(specs, now=1.0)]
    with store.engine.begin() as conn:
        conn.execute(update(runs).values(phase="succeeded"))
    store.note_mlflow([MlflowNote(r, 1, "opened", f"m{i:032x}") for i, r in enumerate(ids)], 2.0)
    # all but every 50th closed: those a start finds and closes again
    store.note_mlflow([MlflowNote(r, 1, "closed", f"m{i:032x}")
                       for i, r in enumerate(ids) if i % 50], 3.0)  # fmt: skip
    return store, ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=15)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        store, _ = build(Path(d) / "s.db", a.runs)

        def fresh() -> list[str]:  # a tick's newly admitted runs (not timed)
            return [r.id for r in store.submit_many([make_spec() for _ in range(a.batch)])]

        ticks, baseline, closes = [], [], []
        for _ in range(a.repeat):
            new, old_way = fresh(), fresh()
            t0 = time.process_time()
            store.note_mlflow([MlflowNote(r, 1, "opened", f"x-{r}") for r in new])
            t1 = time.process_time()
            store.note_many([(r, 1, "mlflow_run", f"x-{r}") for r in old_way])
            t2 = time.process_time()
            store.note_mlflow([MlflowNote(r, 1, "closed", f"x-{r}") for r in new])
            t3 = time.process_time()
            ticks.append(1000 * (t1 - t0))
            baseline.append(1000 * (t2 - t1))
            closes.append(1000 * (t3 - t2))
        res: dict[str, object] = {
            "tick_ms": statistics.median(ticks),
            "tick_events_ms": statistics.median(baseline),
            "close_ms": statistics.median(closes),
        }
        res["recover_ms"] = cpu_ms(lambda: store.unclosed_mlflow_runs(ACTIVE_PHASES), 3)
        res["unclosed"] = len(store.unclosed_mlflow_runs(ACTIVE_PHASES))
        store.close()
        old, old_ids = build(Path(d) / "old.db", a.runs)
        with old.engine.begin() as conn:  # the same runs as the previous version wrote them
            conn.execute(events.delete())
            mlflow_runs.drop(conn)
            conn.execute(schema_version.update().values(version=11))
            rows = [{"run_id": r, "time": 2.0, "kind": "mlflow_run", "attempt": 1,
                     "reason": f"m{i:032x}"} for i, r in enumerate(old_ids)]  # fmt: skip
            rows += [{"run_id": r, "time": 3.0, "kind": "mlflow_closed", "attempt": 1,
                      "reason": f"m{i:032x}"} for i, r in enumerate(old_ids) if i % 50]  # fmt: skip
            conn.execute(events.insert(), rows)
        old.close()
        t0 = time.process_time()
        Store(f"sqlite:///{Path(d) / 'old.db'}").close()
        res["migrate_ms"] = 1000 * (time.process_time() - t0)
    res.update(runs=a.runs, batch=a.batch, load_average_1m=round(os.getloadavg()[0], 2))
    print(f"{'what':<44}{'CPU ms':>10}")
    for key, what in (("tick_ms", f"a tick's {a.batch} opened notes (table)"),
                      ("tick_events_ms", f"  baseline: {a.batch} events (before)"),
                      ("close_ms", f"{a.batch} closed notes (table)"),
                      ("recover_ms", f"a start's unclosed read ({res['unclosed']} found)"),
                      ("migrate_ms", f"v12 migration of {a.runs} runs")):  # fmt: skip
        print(f"{what:<44}{float(res[key]):>10.1f}")  # type: ignore[arg-type]
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}))


if __name__ == "__main__":
    main()
