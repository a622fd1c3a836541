"""The store's lifecycle moves as a busy tick makes them: ``admit_many`` of a cycle's
admissions, ``set_handles``, then each run's end (half ``finish``, a quarter ``requeue`` as
lost, a quarter ``requeue`` as preempted), on a SQLite store. Process CPU seconds per phase
(``time.process_time``: the machine is shared, wall time is noise).

    python benchmarks/store_lifecycle.py [--runs 2000] [--repeat 3]

To compare two trees in the same session, run it once per tree with ``PYTHONPATH`` set to the
tree's root (the store imports no compiled code). Prints a short table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import mlops_gpu
from mlops_gpu.model import Phase, Placement
from mlops_gpu.model.cluster import NodeSlot
from mlops_gpu.state import Store
from mlops_gpu.testing import make_spec

PLACE = Placement("local", "a100-80gb", (NodeSlot("n1", ("0",)),))


def once(n: int, folder: Path) -> dict[str, float]:
    store = Store(f"sqlite:///{folder / 'state.db'}")
    specs = [make_spec("p", 1, name=f"r{i}") for i in range(n)]
    ids = [r.id for r in store.submit_many(specs, now=1.0)]
    out: dict[str, float] = {}
    t = time.process_time()
    assert all(store.admit_many([(i, PLACE) for i in ids], now=2.0))
    out["admit_many"] = time.process_time() - t
    t = time.process_time()
    store.set_handles([(i, f"h{i}") for i in ids], Phase.RUNNING, now=3.0)
    out["set_handles"] = time.process_time() - t
    t = time.process_time()
    for k, i in enumerate(ids):  # one transaction each, as the controller's poll makes them
        if k % 4 < 2:
            store.finish(i, Phase.SUCCEEDED, "exited 0", exit_code=0, now=4.0)
        elif k % 4 == 2:
            store.requeue(i, "lost", "the job vanished", 3, now=4.0, backoff_s=10.0)
        else:
            store.requeue(i, "preempted", "preempted", None, now=4.0, backoff_s=10.0)
    out["ends"] = time.process_time() - t
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    runs: list[dict[str, float]] = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as d:
            runs.append(once(args.runs, Path(d)))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    root = Path(mlops_gpu.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    print(f"tree {root} ({head or 'not a git checkout'}), {args.runs} runs, median of "
          f"{args.repeat}")  # fmt: skip
    print("| phase | CPU ms | us per run |")
    print("| --- | --- | --- |")
    for k, v in med.items():
        print(f"| {k} | {1000 * v:.0f} | {1e6 * v / args.runs:.0f} |")
    print(json.dumps({"tree": str(root), "runs": args.runs, "repeat": args.repeat,
                      "cpu_s": med}))  # fmt: skip


if __name__ == "__main__":
    main()
