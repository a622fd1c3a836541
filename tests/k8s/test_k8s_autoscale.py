"""An elastic Kubernetes pool scaled by a real autoscaler: Karpenter (``sigs.k8s.io/karpenter``
with its kwok cloud provider, ``scripts/karpenter.sh``) on a control plane of its own
(``scripts/k8s.sh`` in ``~/.cache/mlops-gpu/k8s-autoscale`` on ports 26543 and around, with
kube-scheduler and no static nodes, so that only Karpenter's nodes can take the runs).

A burst of 16 one-GPU runs on the empty pool ``gpu`` (NodePool ``gpu``: nodes of 8 A100s):
the scheduler asks for two nodes with two placeholder pods (the queue says which slot each
run waits for), kube-scheduler marks them Unschedulable, Karpenter creates two NodeClaims and
nodes, the placeholders are deleted once the nodes are up, and the runs run there, each exactly
once; once the runs are done, Karpenter's consolidation (``WhenEmpty`` after 15 s) removes
the nodes. The test prints the measured times (``autoscale: ...``); see benchmarks/RESULTS.md
(2026-12-03, load average about 10: all Running 10.5 s after the submit, the pool at 0 nodes
54.5 s after the last run ended).

Skips (with the reason) where ``karpenter-kwok`` is not built, unless ``MLOPS_GPU_REQUIRE_K8S``
is set (CI), where it fails instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.backends.k8s_capacity import POOL_LABEL, SELECTOR
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import TERMINAL_PHASES, Phase, ResourceRequest, Run
from mlops_gpu.testing import config_yaml

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
A100 = "NVIDIA-A100-SXM4-80GB"
CACHE = Path(os.environ.get("MLOPS_GPU_K8S_CACHE", Path.home() / ".cache/mlops-gpu/k8s"))
BINARY = CACHE / f"karpenter-{os.environ.get('MLOPS_GPU_KARPENTER_VERSION', 'v1.13.0')}"
CONSOLIDATE_S = 15
ENV = {
    "MLOPS_GPU_K8S_DIR": str(Path.home() / ".cache/mlops-gpu/k8s-autoscale"),
    "MLOPS_GPU_K8S_ETCD_PORT": "23890", "MLOPS_GPU_K8S_ETCD_PEER_PORT": "23900",
    "MLOPS_GPU_K8S_API_PORT": "26543", "MLOPS_GPU_K8S_KCM_PORT": "26357",
    "MLOPS_GPU_K8S_SCHED_PORT": "26359", "MLOPS_GPU_K8S_KWOK_PORT": "26180",
    "MLOPS_GPU_K8S_POD_DELAY_MS": "500", "MLOPS_GPU_K8S_POD_JITTER_MS": "1000",
    "MLOPS_GPU_KARPENTER_POOL": "gpu", "MLOPS_GPU_KARPENTER_GPU_PRODUCT": A100,
    "MLOPS_GPU_KARPENTER_MAX_NODES": "4", "MLOPS_GPU_KARPENTER_BOOT_DELAY": "2s",
    "MLOPS_GPU_KARPENTER_CONSOLIDATE_AFTER": f"{CONSOLIDATE_S}s",
    "MLOPS_GPU_KARPENTER_METRICS_PORT": "26480", "MLOPS_GPU_KARPENTER_HEALTH_PORT": "26481",
    "MLOPS_GPU_KARPENTER_PYTHON": sys.executable,
}  # fmt: skip


def script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = ["bash", str(REPO / "scripts" / args[0]), *args[1:]]
    env = {**os.environ, **ENV}
    return subprocess.run(cmd, text=True, capture_output=True, timeout=timeout, env=env)


def unavailable(msg: str) -> None:
    if os.environ.get("MLOPS_GPU_REQUIRE_K8S"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def autoscaled() -> Iterator[str]:
    if not (BINARY / "karpenter-kwok").is_file():
        unavailable(f"karpenter-kwok is not built in {BINARY} (run: scripts/karpenter.sh build)")
    script("k8s.sh", "reset", timeout=120)  # from scratch: no nodes or NodeClaims of a last run
    try:
        steps = [("k8s.sh", "start", "--nodes", "0"), ("k8s.sh", "scheduler", "start"),
                 ("karpenter.sh", "start")]  # fmt: skip
        for step in steps:
            proc = script(*step, timeout=3600)
            if proc.returncode != 0:
                unavailable(f"scripts/{' '.join(step)} failed: {proc.stderr[-1500:]}")
        yield str(Path(ENV["MLOPS_GPU_K8S_DIR"]) / "kubeconfig")
    finally:
        script("karpenter.sh", "stop", timeout=60)
        script("k8s.sh", "stop", timeout=120)


def clients(kubeconfig: str) -> tuple[Any, Any]:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=kubeconfig)
    return client.CoreV1Api(api), client.CustomObjectsApi(api)


def pool_nodes(core: Any) -> dict[str, dict[str, str]]:
    return {n.metadata.name: n.metadata.labels
            for n in core.list_node(label_selector=f"{POOL_LABEL}=gpu").items}  # fmt: skip


def nodeclaims(custom: Any) -> list[str]:
    got = custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims")
    return [c["metadata"]["name"] for c in got["items"]]


def runtime(tmp_path: Path, kubeconfig: str) -> Runtime:
    data = yaml.safe_load(config_yaml(projects={"p": (32, 0)}))
    data["gpu_types"] = {"a100-80gb": {"price_per_hour": 2.5}}
    data["projects"]["p"]["quotas"] = {"a100-80gb": {"nominal": 32, "borrowing_limit": 0}}
    data["backends"] = {"k8s": {
        "type": "kubernetes", "kubeconfig": kubeconfig, "inventory_s": 0,
        "gpu_models": {A100: "a100-80gb"},
        "pod_annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "5s"},
    }}  # fmt: skip
    data["pools"] = {"gpu": {"backend": "k8s", "gpu_type": "a100-80gb", "gpus_per_node": 8,
                             "max_nodes": 4, "boot_s": 20, "price_per_node_hour": 10,
                             "idle_s": CONSOLIDATE_S}}  # fmt: skip
    data["retry"] = {"max_attempts": 3, "backoff_s": 0}
    path = tmp_path / "mlops-gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return Runtime.load(path)


def get(rt: Runtime, run: Run) -> Run:
    got = rt.store.get(run.id)
    assert got is not None
    return got


def wait_for(what: str, done: Any, timeout: float, tick: Any = None) -> float:
    """Seconds until ``done()``; ``tick()`` between checks."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if tick is not None:
            tick()
        if done():
            return time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_a_burst_scales_the_pool_up_through_karpenter_and_it_scales_down_when_idle(
    tmp_path: Path, autoscaled: str
) -> None:
    kubeconfig = autoscaled
    core, custom = clients(kubeconfig)
    assert pool_nodes(core) == {} and nodeclaims(custom) == []
    rt = runtime(tmp_path, kubeconfig)
    spec = rt.spec(("python", "train.py"), project="p", request=ResourceRequest(gpus=1))
    t0 = time.monotonic()
    runs = [rt.submit(spec) for _ in range(16)]
    ctl = Controller(rt)
    ctl.tick()  # no node: the pool asks for two (16 GPUs), and the queue says so
    reasons = [get(rt, r).reason or "" for r in runs]
    assert {x.split(" to boot")[0] for x in reasons} == {
        "waiting for node gpu/new-0",
        "waiting for node gpu/new-1",
    }, reasons
    held = core.list_namespaced_pod("default", label_selector=SELECTOR).items
    assert len(held) == 2
    assert all(p.spec.containers[0].resources.requests == {"nvidia.com/gpu": "8"} for p in held)

    def running() -> bool:
        return all(get(rt, r).phase in (Phase.RUNNING, Phase.SUCCEEDED) for r in runs)

    wait_for("every run running on Karpenter's nodes", running, 150, ctl.tick)
    up_s = time.monotonic() - t0  # from the submit
    nodes = pool_nodes(core)
    # two asked; Karpenter may add one more in a race (two provisioning passes, each seeing a
    # placeholder), never more than the pool's max_nodes
    assert 2 <= len(nodes) <= 4 and len(nodeclaims(custom)) == len(nodes), nodes
    assert all(labels["karpenter.sh/nodepool"] == "gpu" for labels in nodes.values())
    assert core.list_namespaced_pod("default", label_selector=SELECTOR).items == []

    def done() -> bool:
        return all(get(rt, r).phase in TERMINAL_PHASES for r in runs)

    wait_for("every run done", done, 90, ctl.tick)
    got = [get(rt, r) for r in runs]
    assert [g.phase for g in got] == [Phase.SUCCEEDED] * 16
    assert {g.attempt for g in got} == {1}
    used = {s.node for g in got if g.placement for s in g.placement.slots}
    assert len(used) == 2 and used <= set(nodes)  # 16 one-GPU runs packed onto new nodes of 8
    for r in runs:  # each ran exactly once: one Job, one pod
        pods = core.list_namespaced_pod("default", label_selector=f"mlops-gpu/run-id={r.id}")
        assert [p.status.phase for p in pods.items] == ["Succeeded"]
    # idle: Karpenter's consolidation removes the nodes (and their NodeClaims; 54.5 s measured
    # at load 10, the limit leaves room for a loaded CI box)
    down_s = wait_for("the pool back at 0 nodes",
                      lambda: not pool_nodes(core) and not nodeclaims(custom),
                      CONSOLIDATE_S + 285, ctl.tick)  # fmt: skip
    assert not {n.name for n in rt.backends["k8s"].inventory()} & set(nodes)
    print(
        f"autoscale: burst of 16 submitted -> all Running in {up_s:.1f} s; last run done -> "
        f"pool at 0 nodes in {down_s:.1f} s (consolidateAfter {CONSOLIDATE_S} s)"
    )
