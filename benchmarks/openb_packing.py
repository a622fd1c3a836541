"""Alibaba openb packing (BENCHMARKS.md; FGD, ATC'23): the openb pods, in creation order and
without departures, onto the trace's 1,213 GPU nodes (CPU and memory modelled), until the GPU
demand that has arrived reaches 100% of the cluster's GPU capacity; a pod that cannot be placed
fails and the replay goes on. Our placement (``default``: the real scheduling core with the
shipped policy) against ``first-fit``, ``best-fit`` and ``random``, on both pod files.

Prints a table and the issue's acceptance checks to stderr, then one JSON object as the last
line: ``{"bench", "results": [{"file", "policy", "allocated_at_80", "allocated_at_90",
"allocated_at_100", "failed_pods", "failed_cpu_pods", "fragmented_gpus", "pods_drawn",
"wall_s"}, ...], "wall_s"}``.

    python benchmarks/openb_packing.py [--file default|gpuspec33]... [--policy NAME]...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from mlops_gpu.sim.openb import POD_FILES, load_nodes, load_pods
from mlops_gpu.sim.packing import PLACERS, replay


def one(file: str, policy: str) -> dict[str, Any]:
    pods = load_pods(POD_FILES[file])
    return replay(pods.file, load_nodes(), pods.pods, policy).row()


def checks(rows: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    out = []
    for file in sorted({r["file"] for r in rows}):
        by = {r["policy"]: r for r in rows if r["file"] == file}
        d = by.get("default")
        if d is None:
            continue
        for other in ("first-fit", "best-fit"):
            if other not in by:
                continue
            for mark in ("90", "100"):
                k = f"allocated_at_{mark}"
                out.append(
                    (
                        f"{file}: default allocates more than {other} at {mark}% "
                        f"({d[k]:.4f} > {by[other][k]:.4f})",
                        d[k] > by[other][k],
                    )
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", action="append", choices=sorted(POD_FILES), help="pod file(s)")
    ap.add_argument("--policy", action="append", choices=PLACERS, help="placer(s)")
    ap.add_argument("--workers", type=int, default=2, help="replays run in parallel")
    args = ap.parse_args()
    files = args.file or sorted(POD_FILES)
    policies = args.policy or list(PLACERS)
    t0 = time.perf_counter()
    jobs = [(f, p) for f in files for p in policies]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = {job: pool.submit(one, *job) for job in jobs}
        rows = []
        for job in jobs:
            rows.append(futures[job].result())
            print(f"  {job[0]} {job[1]}: done in {rows[-1]['wall_s']:.1f}s", file=sys.stderr)
    cols = ["allocated_at_80", "allocated_at_90", "allocated_at_100", "failed_pods"]
    cols += ["fragmented_gpus"]
    print(f"{'file':<34}{'policy':<11}" + "".join(f"{c:>18}" for c in cols), file=sys.stderr)
    for r in rows:
        line = f"{r['file']:<34}{r['policy']:<11}" + "".join(f"{r[c]:>18}" for c in cols)
        print(line, file=sys.stderr)
    for text, ok in checks(rows):
        print(f"{'ok' if ok else 'NO'}  {text}", file=sys.stderr)
    out = {"bench": "openb_packing", "results": rows, "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
