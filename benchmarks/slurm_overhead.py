"""Slurm overhead (issue "Slurm backend"): 300 one-GPU runs of ``sleep 5`` through mlops_gpu onto
the repo's 4 x 8-GPU Slurm cluster (``scripts/slurm.sh``), against the same 300 jobs submitted
with raw ``sbatch --gres=gpu:1`` in the same run. Ours takes the production path: runs submitted
to the store, the ``mlops-gpu scheduler`` daemon (default tick), each job started through the
``mlops-gpu exec`` launcher, and MLflow tracking on (a real ``mlflow server``, SQLite store).

Wall time: from the first submit to the last job's end (Slurm's end time for raw jobs; the
store's for ours). The scheduler is started, and up, before the first submit, as in production;
its CPU time over the run is printed too. Prints a table, then one JSON object as the last
line: ``{"bench", "runs", "ours_wall_s", "sbatch_wall_s", "ratio"}``. Target: ratio <= 1.25.

    python benchmarks/slurm_overhead.py [--runs 300] [--sleep 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from scheduler_daemon import SchedulerDaemon

from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.model import TERMINAL_PHASES, ResourceRequest
from mlops_gpu.testing import config_yaml

REPO = Path(__file__).resolve().parents[1]


def start_slurm() -> str:
    out = subprocess.run(["bash", str(REPO / "scripts" / "slurm.sh"), "start"], check=True,
                         capture_output=True, text=True, timeout=900).stdout  # fmt: skip
    conf = [x for x in out.splitlines() if x.startswith("SLURM_CONF=")][-1].split("=", 1)[1]
    os.environ["SLURM_CONF"] = conf
    return conf


def wait_idle(timeout: float = 120) -> None:
    subprocess.run(["scancel", "--user", os.environ.get("USER", "root")], capture_output=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        jobs = json.loads(subprocess.check_output(["squeue", "--json"]))["jobs"]
        if not [j for j in jobs if j["job_state"] in ("PENDING", "RUNNING", "COMPLETING")]:
            return
        time.sleep(0.5)
    raise RuntimeError("the cluster did not drain")


def raw(n: int, sleep_s: float, log_dir: Path) -> float:
    t0 = time.time()
    ids = []
    for _ in range(n):
        out = subprocess.check_output(
            ["sbatch", "--parsable", "--gres=gpu:1", f"--output={log_dir}/raw-%j.out",
             "--wrap", f"sleep {sleep_s:g}"], text=True,
        )  # fmt: skip
        ids.append(out.strip().split(";")[0])
    pending = set(ids)
    last_end = t0
    while pending:
        time.sleep(0.5)
        for j in json.loads(subprocess.check_output(["squeue", "--json"]))["jobs"]:
            jid = str(j["job_id"])
            if jid in pending and j["job_state"] in ("COMPLETED", "FAILED", "CANCELLED"):
                pending.discard(jid)
                end = j.get("end_time")
                end = end.get("number") if isinstance(end, dict) else end
                last_end = max(last_end, float(end or time.time()))
    return last_end - t0


def mlflow_server(d: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
         f"sqlite:///{d}/mlflow.db", "--default-artifact-root", str(d / "art"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return proc, url
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError("mlflow server did not start") from None
            time.sleep(0.25)


def ours(n: int, sleep_s: float, d: Path, conf: str, tracking: str) -> float:
    data = yaml.safe_load(config_yaml(projects={"bench": (64, 0)}))
    data["gpu_types"] = {"a100-80gb": {"price_per_hour": 2.5}, "h100-80gb": {"price_per_hour": 4}}
    data["backends"] = {
        "hpc": {
            "type": "slurm",
            "slurm_conf": conf,
            "gres_types": {"a100-80gb": "a100", "h100-80gb": "h100"},
        }
    }
    data["projects"]["bench"]["quotas"]["h100-80gb"] = {"nominal": 64, "borrowing_limit": 0}
    data["mlflow"] = {"tracking_uri": tracking}
    data.pop("scheduler", None)  # production defaults
    cfg = d / "mlops-gpu.yaml"
    cfg.write_text(yaml.safe_dump(data))
    rt = Runtime.load(cfg)
    # in production the scheduler is already running when runs arrive: it is up before t0
    with SchedulerDaemon(cfg, d / "scheduler.log") as daemon:
        t0 = time.time()
        runs = [rt.submit(rt.spec(("sleep", f"{sleep_s:g}"), project="bench",
                                  request=ResourceRequest(gpus=1))) for _ in range(n)]  # fmt: skip
        ids = {r.id for r in runs}
        while True:
            time.sleep(0.5)
            done = [r for r in rt.store.list_runs() if r.id in ids and r.phase in TERMINAL_PHASES]
            if len(done) == n:
                bad = [r for r in done if r.phase.value != "succeeded"]
                if bad:
                    raise RuntimeError(f"{len(bad)} runs did not succeed: {bad[0].reason}")
                wall = max(r.finished_at or t0 for r in done) - t0
                print(f"scheduler CPU: {daemon.cpu_s():.1f} s over {wall:.1f} s",
                      file=sys.stderr)  # fmt: skip
                return wall
            if not daemon.alive():
                raise RuntimeError((d / "scheduler.log").read_text()[-2000:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--sleep", type=float, default=5.0)
    ap.add_argument("--keep", type=Path, default=None, help="keep config, store and logs here")
    args = ap.parse_args()
    conf = start_slurm()
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as tmp:
        d = args.keep or Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        wait_idle()
        raw_s = raw(args.runs, args.sleep, d)
        wait_idle()
        server, url = mlflow_server(d)
        try:
            ours_s = ours(args.runs, args.sleep, d, conf, url)
        finally:
            server.terminate()
            server.wait(timeout=60)
    ratio = ours_s / raw_s
    print(f"{'':<22}{'WALL S':>8}", file=sys.stderr)
    print(f"{'raw sbatch':<22}{raw_s:>8.1f}", file=sys.stderr)
    print(f"{'mlops-gpu':<22}{ours_s:>8.1f}", file=sys.stderr)
    print(f"{'ratio (target <=1.25)':<22}{ratio:>8.2f}", file=sys.stderr)
    print(json.dumps({"bench": "slurm_overhead", "runs": args.runs, "ours_wall_s": round(ours_s, 2),
                      "sbatch_wall_s": round(raw_s, 2), "ratio": round(ratio, 3)}))  # fmt: skip


if __name__ == "__main__":
    main()
