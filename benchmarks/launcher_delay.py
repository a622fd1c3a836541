"""The launcher's delay before the run's command starts (issue "MLflow": target under 0.3 s).

For each way of starting a command, the time from spawning the process to the command's first
instruction, which is ``date +%s.%N`` (a tiny binary printing when it started). Measured alone
(``--runs`` times, one after another) and with ``--together`` starting at once, as dozens of
jobs do on one node. No GPU and no MLflow server: the launcher's fixed cost only.

Ways: ``bare`` (the command itself: the baseline), ``launcher`` (``python -m
mlops_gpu.telemetry.launcher``, what backends run), ``cli`` (``mlops-gpu exec``, by hand).

Prints a table, then one JSON object as the last line: ``{"bench", "results": [{"way",
"alone_median_s", "alone_p95_s", "together", "together_median_s", "together_p95_s"}, ...]}``.

    python benchmarks/launcher_delay.py [--runs 20] [--together 24]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

CHILD = ["date", "+%s.%N"]
WAYS = {
    "bare": CHILD,
    "launcher": [sys.executable, "-m", "mlops_gpu.telemetry.launcher", "--", *CHILD],
    "cli": [sys.executable, "-m", "mlops_gpu.cli.main", "exec", "--", *CHILD],
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no devices: the launcher's own cost, not NVML's
    return env


def delays(cmd: list[str], n: int) -> list[float]:
    """Start ``n`` processes at once; each one's delay from its spawn to the child's start."""
    procs = []
    for _ in range(n):
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env())
        procs.append((t0, p))
    out = []
    for t0, p in procs:
        stdout, _ = p.communicate(timeout=60)
        out.append(float(stdout.decode().strip()) - t0)
    return out


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--together", type=int, default=24)
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    for way, cmd in WAYS.items():
        delays(cmd, 1)  # warm the page cache
        alone = [delays(cmd, 1)[0] for _ in range(args.runs)]
        together = delays(cmd, args.together)
        results.append(
            {
                "way": way,
                "alone_median_s": round(statistics.median(alone), 4),
                "alone_p95_s": round(p95(alone), 4),
                "together": args.together,
                "together_median_s": round(statistics.median(together), 4),
                "together_p95_s": round(p95(together), 4),
            }
        )
    print(f"{'WAY':<10}{'ALONE MED':>11}{'ALONE P95':>11}{'TOGETHER MED':>14}{'TOGETHER P95':>14}",
          file=sys.stderr)  # fmt: skip
    for r in results:
        line = f"{r['way']:<10}{r['alone_median_s']:>11.3f}{r['alone_p95_s']:>11.3f}"
        line += f"{r['together_median_s']:>14.3f}{r['together_p95_s']:>14.3f}"
        print(line, file=sys.stderr)
    print(json.dumps({"bench": "launcher_delay", "results": results}))


if __name__ == "__main__":
    main()
