"""A replica of Kueue's scheduler performance test (``baseline`` config), in real time, through
the whole controller: the store, the pure core, and a fake backend whose jobs sleep their runtime.

Set-up (BENCHMARKS.md): 5 cohorts x 6 projects, each with a nominal quota of 20 GPUs and a
borrowing limit of 100 within its cohort; one node of 600 GPUs, so placement never binds and only
quota and priority decide. Each project receives 350 ``small`` (1 GPU, priority 50, 200 ms, one
every 100 ms), 100 ``medium`` (5 GPUs, priority 100, 500 ms, one every 500 ms) and 50 ``large``
(20 GPUs, priority 200, 1 s, one every 1.2 s) runs: 15,000 in all.

A separate process submits the runs on that schedule through ``Runtime.submit`` (the path of the
CLI and SDK) into the store, while this process runs ``Controller.tick`` in a loop. Measured, as
Kueue's recorder does:
- time to admission: the run's first ``admitted`` event minus its submit time, averaged per class;
- usage: GPU-seconds held by admitted runs (admission to finish, from the usage ledger) over
  600 GPUs x the span from the first submit to the last finish;
- wall time: from the first submit to the tick that saw every run finished.

Progress goes to stderr every 10 s; the last line is one JSON object. ``--queues`` and
``--scale`` shrink the set-up for a quick look (the published figures only apply to the full one).

    python benchmarks/kueue_baseline.py [--store URL] [--tick-s 0.05] [--queues 30] [--scale 1]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from mlops_gpu.config import load_config
from mlops_gpu.controller.loop import Controller
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.model import ResourceRequest

COHORTS, PER_COHORT, NODE_GPUS = 5, 6, 600
#: class -> (runs per queue, GPUs, priority, runtime s, creation interval s)
CLASSES: dict[str, tuple[int, int, int, float, float]] = {
    "small": (350, 1, 50, 0.2, 0.1),
    "medium": (100, 5, 100, 0.5, 0.5),
    "large": (50, 20, 200, 1.0, 1.2),
}
#: Kueue's measured averages over 5 runs (BENCHMARKS.md), and its CI thresholds.
KUEUE = {
    "avg_admission_s": {"small": 215.5, "medium": 76.8, "large": 6.7},
    "usage": 0.587,
    "wall_s": 351.0,
    "thresholds": {
        "avg_admission_s": {"small": 260.0, "medium": 90.0, "large": 11.0},
        "usage_min": 0.55,
        "wall_s": 425.0,
    },
}


def config(store: str, queues: int, tick_s: float) -> dict[str, Any]:
    cohorts = max(1, min(COHORTS, queues // PER_COHORT or 1))
    projects = {
        f"q{i:02d}": {
            "cohort": f"cohort{i % cohorts}",
            "quotas": {"gpu": {"nominal": 20, "borrowing_limit": 100}},
        }
        for i in range(queues)
    }
    return {
        "store": store,
        "gpu_types": {"gpu": {}},
        "backends": {
            "fake": {
                "type": "fake",
                "nodes": [{"name": "big", "gpu_type": "gpu", "gpus": NODE_GPUS}],
            }
        },
        "cohorts": {f"cohort{c}": {"parent": None} for c in range(cohorts)},
        "projects": projects,
        "priority_classes": {name: spec[2] for name, spec in CLASSES.items()},
        "default_priority": "small",
        # A preempted run requeues at once, as an evicted Kueue workload does.
        "retry": {"max_attempts": 3, "backoff_s": 0.0},
        "scheduler": {"tick_s": tick_s, "idle_exit_s": 300},
    }


def schedule(queues: int, scale: float) -> list[tuple[float, str, str, int]]:
    """(due s after start, project, class, index), in due order."""
    out = []
    for q in range(queues):
        for cls, (count, _, _, _, every) in CLASSES.items():
            for k in range(max(1, round(count * scale))):
                out.append((k * every, f"q{q:02d}", cls, k))
    out.sort()
    return out


def submitter(cfg_path: str, plan: list[tuple[float, str, str, int]], t0: float, q: Any) -> None:
    """Submit each run when it is due; report the worst lag behind the schedule."""
    rt = Runtime.load(cfg_path)
    worst = 0.0
    for due, project, cls, k in plan:
        delay = t0 + due - time.time()
        if delay > 0:
            time.sleep(delay)
        else:
            worst = max(worst, -delay)
        _, gpus, _, runtime, _ = CLASSES[cls]
        spec = rt.spec(
            ("sleep", str(runtime)),
            project=project,
            name=f"{cls}-{project}-{k}",
            priority=cls,
            request=ResourceRequest(gpus=gpus),
            env={"FAKE_DURATION_S": str(runtime)},
        )
        rt.submit(spec)
    rt.close()
    q.put(worst)


def measure(rt: Runtime, total: int, start: float, end: float) -> dict[str, Any]:
    store = rt.store
    runs = {r.id: r for r in store.list_runs()}
    first_admit: dict[str, float] = {}
    for ev in store.events():
        if ev.kind == "admitted" and ev.run_id not in first_admit:
            first_admit[ev.run_id] = ev.time
    waits: dict[str, list[float]] = defaultdict(list)
    for run in runs.values():
        waits[run.spec.priority].append(first_admit[run.id] - run.submitted_at)
    held = sum(u.gpu_seconds for u in store.usage())
    preempted = sum(1 for ev in store.events() if ev.kind == "preempted")
    return {
        "avg_admission_s": {c: round(statistics.fmean(waits[c]), 2) for c in CLASSES},
        "p99_admission_s": {
            c: round(statistics.quantiles(waits[c], n=100)[98], 2) if len(waits[c]) > 1 else 0.0
            for c in CLASSES
        },
        "usage": round(held / (NODE_GPUS * (end - start)), 4),
        "runs": len(runs),
        "succeeded": sum(1 for r in runs.values() if r.phase.value == "succeeded"),
        "preemptions": preempted,
        "gpu_seconds_held": round(held, 1),
        "expected_runs": total,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="store URL (default: SQLite in a temporary folder)")
    ap.add_argument("--tick-s", type=float, default=0.05, help="the controller's tick period")
    ap.add_argument("--queues", type=int, default=COHORTS * PER_COHORT)
    ap.add_argument("--scale", type=float, default=1.0, help="share of each class's runs")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="kueue-baseline-") as tmp:
        store = args.store or f"sqlite:///{tmp}/state.db"
        cfg_path = Path(tmp) / "mlops-gpu.yaml"
        cfg_path.write_text(yaml.safe_dump(config(store, args.queues, args.tick_s)))
        rt = Runtime(load_config(cfg_path))
        if rt.store.count():
            sys.exit(f"{store}: the store already holds runs; give an empty one")
        plan = schedule(args.queues, args.scale)
        ctl = Controller(rt)
        ctl.acquire()
        lag_q: Any = mp.get_context("fork").Queue()
        t0 = time.time() + 1.0  # the submitter's first due time
        proc = mp.get_context("fork").Process(
            target=submitter, args=(str(cfg_path), plan, t0, lag_q), daemon=True
        )
        proc.start()
        tick_ms: list[float] = []
        next_report = time.time() + 10
        end = t0
        try:
            while True:
                a = time.monotonic()
                rep = ctl.tick()
                tick_ms.append((time.monotonic() - a) * 1000)
                now = time.time()
                if now >= next_report:
                    next_report = now + 10
                    print(
                        f"[{now - t0:6.1f} s] pending {rep.pending:5d}  active {rep.active:4d}  "
                        f"submitted {rt.store.count():5d}/{len(plan)}",
                        file=sys.stderr,
                    )
                if not proc.is_alive() and rep.pending == 0 and rep.active == 0:
                    if rt.store.count() == len(plan):
                        end = now
                        break
                    sys.exit("the submitter stopped early; see its traceback above")
                time.sleep(max(0.0, args.tick_s - (time.monotonic() - a)))
        finally:
            ctl.release()
        worst_lag = lag_q.get(timeout=10)
        proc.join()
        out: dict[str, Any] = {"bench": "kueue_baseline", "queues": args.queues}
        out["workloads"] = len(plan)
        out["wall_s"] = round(end - t0, 2)
        out.update(measure(rt, len(plan), t0, end))
        out["ticks"] = len(tick_ms)
        out["p50_tick_ms"] = round(statistics.median(tick_ms), 2)
        out["p99_tick_ms"] = round(statistics.quantiles(tick_ms, n=100)[98], 2)
        out["submit_worst_lag_s"] = round(worst_lag, 3)
        out["store"] = rt.store.dialect
        out["kueue_published"] = KUEUE
        rt.close()
    print(table(out), file=sys.stderr)
    print(json.dumps(out))


def table(o: dict[str, Any]) -> str:
    k = KUEUE["avg_admission_s"]
    rows = [
        "                      mlops_gpu    Kueue (published)",
        f"wall s              {o['wall_s']:>10.1f}    {KUEUE['wall_s']:>8.1f}",
        f"usage               {o['usage']:>10.3f}    {KUEUE['usage']:>8.3f}",
    ]
    for c in CLASSES:
        rows.append(f"avg admission {c:<6}{o['avg_admission_s'][c]:>10.2f}    {k[c]:>8.1f}")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
