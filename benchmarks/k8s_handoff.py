"""How a placed run is handed to the API server (issue "Benchmarks raised", item 4): what the
burst of ``k8s_throughput.py`` would take if our backend created Pods instead of Jobs.

``k8s_throughput.py`` found both sides bound by the same thing: ours writes a Job pinned with
``nodeName``, kube-scheduler's side writes the same Job without it, and for both the Job
controller then creates the pod. Ours saves only the binding write. This benchmark measures
the design change that would take the Job controller off our path: the backend creating the pod
itself (pinned with ``nodeName``; the scheduler already owns retries, requeues and cancellation,
which is what the Job adds). Three hand-offs of the same pod template, alternated ``--repeat``
times on one control plane of its own (``scripts/k8s.sh``, 100 kwok nodes of 8 GPUs, the rate
limits of ``k8s_throughput.py``):

- ``job-pinned``: what our backend writes today (a Job, pod template with ``nodeName``);
- ``pod-pinned``: the proposal (a Pod with ``nodeName``, no Job);
- ``job-kube-scheduler``: the baseline of ``k8s_throughput.py`` (the Job without ``nodeName``,
  kube-scheduler binds the pod).

Each creates ``--runs`` objects from 8 threads through one token bucket of ``--qps``/``--burst``
(the clients' limit in ``k8s_throughput.py``); the time runs from the first create until one pod
watch has seen every pod Running. The scheduling decision itself is not in these times (ours
takes 20 ms for 800 runs, ``benchmarks/RESULTS.md``): this isolates the hand-off. Prints a
table, then one JSON object as the last line: ``{"bench", "runs", "repeat", "median_s": {mode:
s}, "all_s": {mode: [s...]}, "ratio_pod_vs_kube_scheduler", "ratio_job_vs_kube_scheduler"}``.

    python benchmarks/k8s_handoff.py [--runs 800] [--repeat 3] [--qps 500] [--burst 1000]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from k8s_throughput import (
    HOLD,
    NAMESPACE,
    RunningWatch,
    clients,
    create_all,
    empty_cluster,
    k8s,
    k8s_env,
    unpinned,
)

from mlops_gpu.backends.base import LaunchRequest
from mlops_gpu.backends.k8s_manifest import PodSettings, job_manifest
from mlops_gpu.model import NodeSlot, Placement, ResourceRequest, RunSpec

MODES = ("job-kube-scheduler", "job-pinned", "pod-pinned")
# Ports apart from the test cluster's and from k8s_throughput.py's, so all can be up at once.
PORTS = {"ETCD_PORT": 43790, "ETCD_PEER_PORT": 43800, "API_PORT": 46443, "KCM_PORT": 46257,
         "SCHED_PORT": 46259, "KWOK_PORT": 46080}  # fmt: skip


def manifests(mode: str, n: int, tag: str, nodes: int) -> list[dict[str, Any]]:
    """``n`` objects of one mode; pinned ones spread over the nodes, one GPU each."""
    spec = RunSpec(
        name="handoff",
        user="bench",
        project="bench",
        command=("sleep", "3600"),
        request=ResourceRequest(gpus=1),
    )
    pod = PodSettings(namespace=NAMESPACE, annotations=HOLD)
    out = []
    for i in range(n):
        slot = Placement("k8s", "a100-80gb", (NodeSlot(f"kwok-node-{i % nodes}", ("0",)),))
        job = job_manifest(LaunchRequest(f"{tag}{i:05d}", 1, spec, slot), pod, {})
        if mode == "job-kube-scheduler":
            out.append(unpinned(job))
        elif mode == "job-pinned":
            out.append(job)
        else:  # the Job's pod template as a Pod of its own, under the Job's name
            tpl = copy.deepcopy(job["spec"]["template"])
            tpl["metadata"]["name"] = job["metadata"]["name"]
            out.append({"apiVersion": "v1", "kind": "Pod", **tpl})
    return out


def burst(mode: str, objs: list[dict[str, Any]], qps: int, burst_: int, core: Any, batch: Any,
          watch: RunningWatch, ids: set[str]) -> float:  # fmt: skip
    t0 = time.time()
    created = create_all(objs, qps, burst_, core, batch)
    end = watch.wait_running(ids, timeout=600)
    last_pod = max(watch.seen[i] for i in ids) - t0
    print(f"  {mode}: {len(objs)} created in {created:.1f} s, last pod after {last_pod:.1f} s, "
          f"all Running after {end - t0:.1f} s", file=sys.stderr)  # fmt: skip
    return end - t0


def measure(args: argparse.Namespace, env: dict[str, str], kubeconfig: str) -> dict[str, Any]:
    core, batch = clients(kubeconfig)
    watch = RunningWatch(core)
    watch.start()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(args.repeat):
        for mode in MODES:  # alternated, so that drift in the cluster hits every mode
            tag = f"h{rep}{MODES.index(mode)}x"
            print(f"round {rep + 1}/{args.repeat}: {mode} ...", file=sys.stderr)
            if mode == "job-kube-scheduler":
                k8s(env, "scheduler", "start")
            objs = manifests(mode, args.runs, tag, nodes=100)
            ids = {f"{tag}{i:05d}" for i in range(args.runs)}
            times[mode].append(burst(mode, objs, args.qps, args.burst, core, batch, watch, ids))
            if mode == "job-kube-scheduler":
                k8s(env, "scheduler", "stop")
            empty_cluster(core, batch)
    watch.stop.set()
    med = {m: round(statistics.median(v), 2) for m, v in times.items()}
    return {
        "bench": "k8s_handoff",
        "runs": args.runs,
        "repeat": args.repeat,
        "median_s": med,
        "all_s": {m: [round(x, 2) for x in v] for m, v in times.items()},
        "ratio_pod_vs_kube_scheduler": round(med["job-kube-scheduler"] / med["pod-pinned"], 3),
        "ratio_job_vs_kube_scheduler": round(med["job-kube-scheduler"] / med["job-pinned"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=800)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--qps", type=int, default=500)
    ap.add_argument("--burst", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="k8s-handoff-") as tmp:
        env = k8s_env(Path(tmp) / "cluster", args.qps, args.burst)
        env.update({f"MLOPS_GPU_K8S_{k}": str(v) for k, v in PORTS.items()})
        print("starting the control plane and 100 kwok nodes ...", file=sys.stderr)
        out = k8s(env, "start")
        kubeconfig = [x for x in out.splitlines() if x.startswith("KUBECONFIG=")][-1][11:]
        try:
            result = measure(args, env, kubeconfig)
        finally:
            k8s(env, "stop")
    print(f"{'hand-off':<22}{'median s':>10}  all", file=sys.stderr)
    for m in MODES:
        print(f"{m:<22}{result['median_s'][m]:>10}  {result['all_s'][m]}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
