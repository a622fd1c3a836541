"""Kubernetes throughput (issue "Kubernetes backend"): mlops_gpu placing runs on 100 kwok nodes x
8 GPUs against kube-scheduler placing the same Jobs, on a control plane of its own.

Set-up, stated and equal for every component:
- The control plane is ``scripts/k8s.sh`` in a state folder and on ports of its own (the test
  cluster is left alone), 100 fake nodes of 8 GPUs in two GPU models.
- API client rate limits: kube-controller-manager ``--kube-api-qps/--kube-api-burst`` and
  kube-scheduler's ``clientConnection.qps/burst`` are ``--qps``/``--burst`` (500/1000); ours are
  the backend's ``api_qps``/``api_burst`` set to the same; the baseline's Job creations take
  tokens from a bucket of the same size. ``--concurrent-job-syncs`` is 50.
- kwok plays the kubelet: pod-create and pod-ready each take between 200 ms and 1.2 s;
  every pod carries ``pod-complete.stage.kwok.x-k8s.io/delay: 1h`` so nothing finishes during a
  measurement.
- Ours takes the production path: runs submitted to the store (SQLite) from this process, the
  ``mlops-gpu scheduler`` daemon with production defaults (1 s tick) in its own process, a Job
  per run pinned with ``nodeName``. MLflow tracking is off (this compares schedulers).
- The baseline creates the very manifests our backend writes, without ``nodeName``, from 8
  threads, and kube-scheduler binds their pods.
- "Running" is when one watch on the pods (the same code for both) first sees phase Running.

Phases: (a) burst: ``--runs`` one-GPU runs (800 fit on 800 GPUs) submitted at once (ours: one
``Runtime.submit_many``, one store transaction), the time from the submit until all are
Running, baseline then ours, ``--repeat`` times each (alternated; medians reported); (b)
steady: ``--rate`` runs a second for ``--seconds`` through ours, one submit each, p50/p99
submit-to-Running. The cluster is emptied between phases. Prints a table, then one JSON object
as the last line: ``{"bench", "runs", "ours_burst_s", "kube_scheduler_burst_s", "ratio",
"p99_submit_to_running_s", ...}``; ``ratio`` is kube-scheduler's time over ours. Targets:
ratio >= 1, p99 <= 5 s.

    python benchmarks/k8s_throughput.py [--runs 800] [--repeat 3] [--rate 20] [--seconds 30]
                                        [--qps 500] [--burst 1000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from scheduler_daemon import SchedulerDaemon

from mlops_gpu.backends.base import LaunchRequest
from mlops_gpu.backends.k8s_manifest import MANAGED_BY, PodSettings, job_manifest
from mlops_gpu.backends.k8s_watch import watch_events
from mlops_gpu.backends.rate_limit import TokenBucket
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.model import NodeSlot, Placement, ResourceRequest, RunSpec

REPO = Path(__file__).resolve().parents[1]
A100, H100 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"
NAMESPACE = "default"
SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
HOLD = {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}
# Ports apart from the test cluster's (scripts/k8s.sh defaults), so both can be up at once.
PORTS = {"ETCD_PORT": 33790, "ETCD_PEER_PORT": 33800, "API_PORT": 36443, "KCM_PORT": 36257,
         "SCHED_PORT": 36259, "KWOK_PORT": 36080}  # fmt: skip


def k8s_env(state: Path, qps: int, burst: int) -> dict[str, str]:
    env = dict(os.environ, MLOPS_GPU_K8S_DIR=str(state))
    env.update({f"MLOPS_GPU_K8S_{k}": str(v) for k, v in PORTS.items()})
    env.update(MLOPS_GPU_K8S_API_QPS=str(qps), MLOPS_GPU_K8S_API_BURST=str(burst),
               MLOPS_GPU_K8S_CONCURRENT_JOB_SYNCS="50", MLOPS_GPU_K8S_POD_DELAY_MS="200",
               MLOPS_GPU_K8S_POD_JITTER_MS="1200")  # fmt: skip
    return env


def k8s(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "k8s.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/k8s.sh {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def clients(kubeconfig: str) -> tuple[Any, Any]:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    return client.CoreV1Api(api), client.BatchV1Api(api)


class RunningWatch(threading.Thread):
    """First time each pod (by its ``mlops-gpu/run-id`` label) is seen Running, by one watch
    on our pods; raw JSON lines, so that watching costs this process little CPU."""

    def __init__(self, core: Any) -> None:
        super().__init__(daemon=True)
        self.core = core
        self.running: dict[str, float] = {}
        self.seen: dict[str, float] = {}  # first seen at all: created
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _seen(self, pod: dict[str, Any], at: float) -> None:
        rid = ((pod.get("metadata") or {}).get("labels") or {}).get("mlops-gpu/run-id")
        if not rid:
            return
        self.seen.setdefault(rid, at)
        if (pod.get("status") or {}).get("phase") == "Running":
            self.running.setdefault(rid, at)

    def _list(self) -> str:
        resp = self.core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR,
                                             _preload_content=False)  # fmt: skip
        body = json.loads(resp.data)
        resp.release_conn()
        now = time.time()
        for pod in body["items"]:
            self._seen(pod, now)
        return str(body["metadata"]["resourceVersion"])

    def run(self) -> None:
        try:
            rv = self._list()
            while not self.stop.is_set():
                resp = self.core.list_namespaced_pod(
                    NAMESPACE, label_selector=SELECTOR, watch=True, resource_version=rv,
                    timeout_seconds=5, allow_watch_bookmarks=True, _preload_content=False,
                )  # fmt: skip
                try:
                    rv = self._follow(resp, rv)
                finally:
                    resp.release_conn()
        except BaseException as e:  # reported by wait_running
            self.error = e

    def _follow(self, resp: Any, rv: str) -> str:
        """Read one watch's events; the resourceVersion to go on from."""
        for ev in watch_events(resp):
            if ev["type"] == "ERROR":  # 410 Gone: list again
                return self._list()
            obj = ev["object"]
            rv = obj["metadata"]["resourceVersion"]
            self._seen(obj, time.time())
        return rv

    def wait_running(self, ids: set[str], timeout: float) -> float:
        """Block until every id is Running; the time the last one was seen Running."""
        deadline = time.time() + timeout
        while not ids <= self.running.keys():
            if self.error is not None:
                raise RuntimeError(f"the pod watch failed: {self.error}")
            if time.time() > deadline:
                missing = len(ids - self.running.keys())
                raise RuntimeError(f"{missing} of {len(ids)} pods not Running after {timeout} s")
            time.sleep(0.05)
        return max(self.running[i] for i in ids)


def empty_cluster(core: Any, batch: Any, timeout: float = 300) -> None:
    """Delete every Job and pod of ours and wait until no pod is left."""
    batch.delete_collection_namespaced_job(NAMESPACE, label_selector=SELECTOR,
                                           propagation_policy="Background")  # fmt: skip
    core.delete_collection_namespaced_pod(NAMESPACE, label_selector=SELECTOR,
                                          grace_period_seconds=0)  # fmt: skip
    deadline = time.time() + timeout
    while True:
        resp = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR, _preload_content=False)
        left = json.loads(resp.data)["items"]
        resp.release_conn()
        if not left:
            return
        if time.time() > deadline:
            raise RuntimeError(f"{len(left)} pods still there after {timeout} s")
        time.sleep(1)


def unpinned(job: dict[str, Any]) -> dict[str, Any]:
    """A Job our backend writes, less ``nodeName`` (and its nodes annotation): kube-scheduler's
    to place."""
    job["spec"]["template"]["spec"].pop("nodeName")
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        meta["annotations"].pop("mlops-gpu/nodes")
    return job


def create_all(objs: list[dict[str, Any]], qps: int, burst: int, core: Any, batch: Any) -> float:
    """Create ``objs`` (Jobs or Pods) from 8 threads through one token bucket; the seconds it
    took, from the first create."""
    bucket = TokenBucket(qps, burst)

    def create(m: dict[str, Any]) -> None:
        bucket.take()
        if m.get("kind") == "Pod":
            resp = core.create_namespaced_pod(NAMESPACE, m, _preload_content=False)
        else:
            resp = batch.create_namespaced_job(NAMESPACE, m, _preload_content=False)
        resp.drain_conn()
        resp.release_conn()  # (else each create opens a new TLS connection)

    t0 = time.time()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, objs))
    return time.time() - t0


def baseline_burst(n: int, qps: int, burst: int, core: Any, batch: Any, watch: RunningWatch,
                   spec: Any, tag: str) -> float:  # fmt: skip
    """kube-scheduler: the manifests our backend writes, less ``nodeName``, created at once."""
    pod = PodSettings(namespace=NAMESPACE, annotations=HOLD)
    slot = Placement("k8s", "a100-80gb", (NodeSlot("kwok-node-0", ("0",)),))
    manifests = [
        unpinned(job_manifest(LaunchRequest(f"{tag}{i:05d}", 1, spec, slot), pod, {}))
        for i in range(n)
    ]
    t0 = time.time()
    created = create_all(manifests, qps, burst, core, batch)
    end = watch.wait_running({f"{tag}{i:05d}" for i in range(n)}, timeout=600)
    last_pod = max(watch.seen[f"{tag}{i:05d}"] for i in range(n)) - t0
    print(f"  kube-scheduler: {n} Jobs created in {created:.1f} s, last pod created after "
          f"{last_pod:.1f} s, all Running after {end - t0:.1f} s", file=sys.stderr)  # fmt: skip
    return end - t0


def runtime(d: Path, kubeconfig: str, qps: int, burst: int) -> Runtime:
    """A config of one Kubernetes backend and one project with all 800 GPUs as its quota."""
    d.mkdir(parents=True, exist_ok=True)
    quota = {"nominal": 400, "borrowing_limit": 0}
    data = {
        "store": "sqlite:///state.db",
        "state_dir": "state",
        "gpu_types": {
            "a100-80gb": {"price_per_hour": 2.5},
            "h100-80gb": {"price_per_hour": 4},
        },
        "backends": {
            "k8s": {
                "type": "kubernetes",
                "kubeconfig": kubeconfig,
                "namespace": NAMESPACE,
                "gpu_models": {A100: "a100-80gb", H100: "h100-80gb"},
                "pod_annotations": HOLD,
                "api_qps": qps,
                "api_burst": burst,
            }
        },
        "projects": {"bench": {"quotas": {"a100-80gb": quota, "h100-80gb": quota}}},
        "mlflow": {"enabled": False},
    }
    cfg = d / "mlops-gpu.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    return Runtime.load(cfg)


@dataclass
class Ours:
    """A store, a config and a running ``mlops-gpu scheduler`` daemon."""

    d: Path
    kubeconfig: str
    qps: int
    burst: int
    rt: Runtime = field(init=False)
    daemon: SchedulerDaemon = field(init=False)

    def __enter__(self) -> Ours:
        self.rt = runtime(self.d, self.kubeconfig, self.qps, self.burst)
        assert self.rt.cfg.source is not None
        self.daemon = SchedulerDaemon(Path(self.rt.cfg.source), self.d / "scheduler.log")
        self.daemon.__enter__()  # up before the first submit
        return self

    def spec(self) -> RunSpec:
        return self.rt.spec(("sleep", "3600"), project="bench", request=ResourceRequest(gpus=1))

    def submit(self) -> str:
        return self.rt.submit(self.spec()).id

    def submit_many(self, n: int) -> set[str]:
        """``n`` runs at once: one store transaction (``Runtime.submit_many``)."""
        return {r.id for r in self.rt.submit_many([self.spec() for _ in range(n)])}

    def cpu_s(self) -> float:
        return self.daemon.cpu_s()

    def __exit__(self, *exc: object) -> None:
        self.daemon.__exit__(*exc)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=800)
    ap.add_argument("--rate", type=float, default=20.0, help="steady phase: runs a second")
    ap.add_argument("--seconds", type=float, default=30.0, help="steady phase: how long")
    ap.add_argument("--repeat", type=int, default=3, help="bursts of each; medians reported")
    ap.add_argument("--qps", type=int, default=500, help="every API client's QPS")
    ap.add_argument("--burst", type=int, default=1000, help="every API client's burst")
    ap.add_argument("--keep", type=Path, default=None, help="keep configs, stores and logs here")
    args = ap.parse_args()
    # a kill (SIGTERM) unwinds like Ctrl-C: the daemon and the control plane are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="k8s-bench-") as tmp:
        d = args.keep or Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        env = k8s_env(d / "cluster", args.qps, args.burst)
        t = time.time()
        print("starting the control plane and 100 kwok nodes ...", file=sys.stderr)
        out = k8s(env, "start")
        kubeconfig = [x for x in out.splitlines() if x.startswith("KUBECONFIG=")][-1][11:]
        print(f"  up in {time.time() - t:.0f} s", file=sys.stderr)
        try:
            result = measure(args, d, env, kubeconfig)
        finally:
            k8s(env, "stop")
    print(f"{'':<34}{'VALUE':>10}", file=sys.stderr)
    for key in ("kube_scheduler_burst_s", "ours_burst_s", "ratio", "ours_burst_cpu_s",
                "p50_submit_to_running_s", "p99_submit_to_running_s"):  # fmt: skip
        print(f"{key:<34}{result[key]:>10}", file=sys.stderr)
    print(json.dumps(result))


def measure(args: argparse.Namespace, d: Path, env: dict[str, str], kubeconfig: str) -> dict:
    core, batch = clients(kubeconfig)
    watch = RunningWatch(core)
    watch.start()
    n = args.runs
    probe = runtime(d / "probe", kubeconfig, args.qps, args.burst)  # the same RunSpec as ours
    spec = probe.spec(("sleep", "3600"), project="bench", request=ResourceRequest(gpus=1))
    base_all: list[float] = []
    ours_all: list[float] = []
    cpu_all: list[float] = []
    for rep in range(args.repeat):  # alternated, so that drift in the cluster hits both
        print(f"burst {rep + 1}/{args.repeat}: {n} Jobs through kube-scheduler ...",
              file=sys.stderr)  # fmt: skip
        k8s(env, "scheduler", "start")
        base_all.append(
            baseline_burst(n, args.qps, args.burst, core, batch, watch, spec, f"base{rep}x")
        )
        k8s(env, "scheduler", "stop")
        empty_cluster(core, batch)
        print(f"burst {rep + 1}/{args.repeat}: {n} runs through mlops-gpu ...", file=sys.stderr)
        with Ours(d / f"burst{rep}", kubeconfig, args.qps, args.burst) as ours:
            t0 = time.time()
            ids = ours.submit_many(n)
            submitted = time.time() - t0
            ours_all.append(watch.wait_running(ids, timeout=600) - t0)
            cpu_all.append(ours.cpu_s())
        last_pod = max(watch.seen[i] for i in ids) - t0
        print(
            f"  mlops-gpu: {n} runs submitted in {submitted:.1f} s, last pod created after "
            f"{last_pod:.1f} s, all Running after {ours_all[-1]:.1f} s",
            file=sys.stderr,
        )
        empty_cluster(core, batch)
    base_s, ours_s, burst_cpu = (statistics.median(x) for x in (base_all, ours_all, cpu_all))
    # (b) steady, ours
    total = round(args.rate * args.seconds)
    print(f"steady: {args.rate:g} runs/s for {args.seconds:g} s ...", file=sys.stderr)
    with Ours(d / "steady", kubeconfig, args.qps, args.burst) as ours:
        submit_at: dict[str, float] = {}
        t0 = time.time()
        for i in range(total):
            time.sleep(max(0.0, t0 + i / args.rate - time.time()))
            at = time.time()
            submit_at[ours.submit()] = at
        watch.wait_running(set(submit_at), timeout=600)
        steady_cpu = ours.cpu_s()
    lat = [watch.running[r] - at for r, at in submit_at.items()]
    empty_cluster(core, batch)
    watch.stop.set()
    return {
        "bench": "k8s_throughput",
        "runs": n,
        "nodes": 100,
        "gpus": 800,
        "api_qps": args.qps,
        "api_burst": args.burst,
        "ours_burst_s": round(ours_s, 2),
        "kube_scheduler_burst_s": round(base_s, 2),
        "ratio": round(base_s / ours_s, 3),
        "ours_burst_cpu_s": round(burst_cpu, 1),
        "burst_repeats": args.repeat,
        "ours_burst_all_s": [round(x, 2) for x in ours_all],
        "kube_scheduler_burst_all_s": [round(x, 2) for x in base_all],
        "steady_runs": total,
        "steady_rate_per_s": args.rate,
        "p50_submit_to_running_s": round(pct(lat, 0.5), 2),
        "p99_submit_to_running_s": round(pct(lat, 0.99), 2),
        "ours_steady_cpu_s": round(steady_cpu, 1),
    }


if __name__ == "__main__":
    main()
