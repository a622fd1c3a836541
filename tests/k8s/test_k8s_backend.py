"""The Kubernetes backend against the repo's real control plane (``scripts/k8s.sh``: 100 kwok
nodes of 8 GPUs, half A100 and half H100): inventory, a pinned 4-GPU run that completes, a
2-node gang bound pod by pod, rejection at submit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.controller import Controller, Runtime, SubmitError
from mlops_gpu.model import ACTIVE_PHASES, TERMINAL_PHASES, Phase, ResourceRequest, Run
from mlops_gpu.testing import config_yaml

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
A100, H100 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"


def api(kubeconfig: str) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))


@pytest.fixture
def clean(kubeconfig: str) -> Iterator[None]:
    from kubernetes import client, config

    batch = client.BatchV1Api(config.new_client_from_config(config_file=kubeconfig))
    core = api(kubeconfig)

    ours = "app.kubernetes.io/managed-by=mlops-gpu"

    def wipe() -> None:
        batch.delete_collection_namespaced_job("default", propagation_policy="Background",
                                               label_selector=ours)  # fmt: skip
        core.delete_collection_namespaced_pod("default", grace_period_seconds=0,
                                              label_selector=ours)  # fmt: skip
        for n in core.list_node().items:
            if n.spec.unschedulable:
                core.patch_node(n.metadata.name, {"spec": {"unschedulable": False}})

    wipe()
    yield
    wipe()


def k8s_runtime(
    tmp_path: Path,
    kubeconfig: str,
    projects: Any = None,
    backends_extra: dict[str, Any] | None = None,
    **extra: Any,
) -> Runtime:
    data = yaml.safe_load(config_yaml(projects=projects or {"p": (64, 0)}))
    data["gpu_types"] = {"a100-80gb": {"price_per_hour": 2.5}, "h100-80gb": {"price_per_hour": 4},
                         "v100-16gb": {"price_per_hour": 1}}  # fmt: skip
    data["backends"] = {"k8s": {
        "type": "kubernetes", "kubeconfig": kubeconfig, "inventory_s": 0,
        "gpu_models": {A100: "a100-80gb", H100: "h100-80gb"},
        "pod_annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "3s"},
    }}  # fmt: skip
    data["backends"]["k8s"].update(backends_extra or {})
    for p in data["projects"].values():
        nominal = p["quotas"]["a100-80gb"]["nominal"]
        for t in ("h100-80gb", "v100-16gb"):
            p["quotas"][t] = {"nominal": nominal, "borrowing_limit": 0}
    data["retry"] = {"max_attempts": 3, "backoff_s": 0}
    data.update(extra)
    path = tmp_path / "mlops-gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return Runtime.load(path)


def drive(rt: Runtime, ctl: Controller, done: Callable[[], bool], timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ctl.tick()
        if done():
            return
        time.sleep(0.2)
    raise AssertionError(
        f"timed out: {[(r.spec.name, r.phase.value, r.reason) for r in rt.store.list_runs()]}"
    )


def run_pods(kubeconfig: str, run: Run) -> list[Any]:
    selector = f"mlops-gpu/run-id={run.id}"
    return list(api(kubeconfig).list_namespaced_pod("default", label_selector=selector).items)


def get(rt: Runtime, run: Run) -> Run:
    got = rt.store.get(run.id)
    assert got is not None
    return got


def test_inventory_lists_the_fake_gpu_nodes(tmp_path: Path, kubeconfig: str, clean: None) -> None:
    rt = k8s_runtime(tmp_path, kubeconfig)
    nodes = rt.backends["k8s"].inventory()
    assert len(nodes) >= 100 and all(n.capacity == 8 for n in nodes)
    assert {n.gpu_type for n in nodes} == {"a100-80gb", "h100-80gb"}
    from conftest import run_cli

    out = run_cli("--config", str(rt.cfg.source), "nodes", "--json")
    listed = json.loads(out.stdout)
    assert len(listed) >= 100 and all(n["free_gpus"] == 8 for n in listed)


def test_a_pinned_run_completes_and_a_gang_spans_two_nodes(
    tmp_path: Path, kubeconfig: str, clean: None
) -> None:
    rt = k8s_runtime(tmp_path, kubeconfig)
    one = rt.submit(
        rt.spec(
            ("python", "train.py"),
            project="p",
            request=ResourceRequest(gpus=4, gpu_types=("h100-80gb",)),
        )
    )
    gang = rt.submit(rt.spec(("torchrun", "train.py"), project="p",
                             request=ResourceRequest(gpus=1, nodes=2)))  # fmt: skip
    ctl = Controller(rt)
    drive(rt, ctl, lambda: all(get(rt, r).phase in TERMINAL_PHASES for r in (one, gang)), 120)
    assert get(rt, one).phase is Phase.SUCCEEDED and get(rt, gang).phase is Phase.SUCCEEDED
    placed = get(rt, one).placement
    assert placed is not None
    pods = run_pods(kubeconfig, one)
    assert [p.spec.node_name for p in pods] == list(placed.node_names)
    g = get(rt, gang).placement
    assert g is not None and len(set(g.node_names)) == 2
    gpods = run_pods(kubeconfig, gang)
    assert sorted(p.spec.node_name for p in gpods) == sorted(g.node_names)


def test_a_model_no_node_has_is_rejected_at_submit(tmp_path: Path, kubeconfig: str) -> None:
    rt = k8s_runtime(tmp_path, kubeconfig)
    with pytest.raises(SubmitError, match="v100-16gb"):
        rt.submit(rt.spec(("x",), project="p",
                          request=ResourceRequest(gpus=1, gpu_types=("v100-16gb",))))  # fmt: skip


class PodWatch:
    """Every pod event of one run, seen from a thread (a deleted pod can vanish at once)."""

    def __init__(self, kubeconfig: str, run: Run) -> None:
        import threading

        from kubernetes import watch

        self.events: list[Any] = []
        self._w = watch.Watch()
        core = api(kubeconfig)

        def follow() -> None:
            import contextlib

            from urllib3.exceptions import HTTPError

            with contextlib.suppress(HTTPError):  # stop() ends the stream under the reader
                for ev in self._w.stream(core.list_namespaced_pod, "default", timeout_seconds=120,
                                         label_selector=f"mlops-gpu/run-id={run.id}"):  # fmt: skip
                    self.events.append(ev["object"])

        self._t = threading.Thread(target=follow, daemon=True)
        self._t.start()

    def stop(self) -> None:
        self._w.stop()


def test_preemption_deletes_the_pod_with_its_grace_and_the_run_requeues(
    tmp_path: Path, kubeconfig: str, clean: None
) -> None:
    from mlops_gpu.model import CheckpointPolicy

    rt = k8s_runtime(tmp_path, kubeconfig, projects={"p": (8, 0)}, policy={"order": "submit"})
    long = ResourceRequest(gpus=8, gpu_types=("h100-80gb",))
    low = rt.submit(rt.spec(("python", "train.py"), project="p", priority="low", request=long,
                            checkpoint=CheckpointPolicy(signal="SIGUSR1", grace_s=25)))  # fmt: skip
    ctl = Controller(rt)
    drive(rt, ctl, lambda: get(rt, low).phase is Phase.RUNNING)
    watch = PodWatch(kubeconfig, low)
    time.sleep(1)
    high = rt.submit(rt.spec(("python", "eval.py"), project="p", priority="high", request=long))
    drive(rt, ctl, lambda: get(rt, high).phase in (Phase.RUNNING, Phase.SUCCEEDED))
    watch.stop()
    graces = {p.metadata.deletion_grace_period_seconds for p in watch.events}
    assert 25 in graces  # the victim's pod was deleted with the run's checkpoint grace
    kinds = [e.kind for e in rt.store.events(low.id)]
    assert "preempting" in kinds and "preempted" in kinds and "lost" not in kinds
    # the high run ends after kwok's delay; the victim then comes back as attempt 2
    drive(rt, ctl, lambda: get(rt, low).phase is Phase.SUCCEEDED and get(rt, low).attempt == 2,
          180)  # fmt: skip


def test_a_cordoned_node_takes_no_runs(tmp_path: Path, kubeconfig: str, clean: None) -> None:
    rt = k8s_runtime(tmp_path, kubeconfig)
    core = api(kubeconfig)
    h100 = sorted(n.name for n in rt.backends["k8s"].inventory() if n.gpu_type == "h100-80gb")
    for name in h100[1:]:
        core.patch_node(name, {"spec": {"unschedulable": True}})
    run = rt.submit(rt.spec(("x",), project="p",
                            request=ResourceRequest(gpus=1, gpu_types=("h100-80gb",))))  # fmt: skip
    drive(rt, Controller(rt), lambda: get(rt, run).phase in TERMINAL_PHASES, 120)
    placed = get(rt, run).placement
    assert placed is not None and placed.node_names == (h100[0],)


def test_a_node_deleted_under_a_run_loses_it_and_it_runs_again(
    tmp_path: Path, kubeconfig: str, clean: None
) -> None:
    rt = k8s_runtime(tmp_path, kubeconfig, backends_extra={"pod_annotations": {
        "pod-complete.stage.kwok.x-k8s.io/delay": "20s"}})  # fmt: skip
    core = api(kubeconfig)
    run = rt.submit(rt.spec(("x",), project="p",
                            request=ResourceRequest(gpus=2, gpu_types=("a100-80gb",))))  # fmt: skip
    ctl = Controller(rt)
    drive(rt, ctl, lambda: get(rt, run).phase is Phase.RUNNING)
    placed = get(rt, run).placement
    assert placed is not None
    node = placed.node_names[0]
    saved = core.read_node(node)
    core.delete_node(node)
    try:
        drive(rt, ctl, lambda: get(rt, run).attempt == 2)
        assert "lost" in [e.kind for e in rt.store.events(run.id)]
        again = get(rt, run)
        assert again.phase in (Phase.PENDING, *ACTIVE_PHASES)
        assert again.placement is None or node not in again.placement.node_names
        rt.store.request_cancel(run.id)
        drive(rt, ctl, lambda: get(rt, run).phase in TERMINAL_PHASES)
    finally:  # put the node back as it was (kwok takes it over again)
        from kubernetes import client

        meta = saved.metadata
        body = client.V1Node(metadata=client.V1ObjectMeta(
            name=node, labels=meta.labels, annotations=meta.annotations))  # fmt: skip
        core.create_node(body)
        status = {"capacity": saved.status.capacity, "allocatable": saved.status.allocatable}
        core.patch_node_status(node, {"status": status})


def test_restarting_the_api_server_mid_run_loses_nothing(
    tmp_path: Path, kubeconfig: str, clean: None
) -> None:
    import os
    import signal
    import subprocess

    from .conftest import REPO

    rt = k8s_runtime(tmp_path, kubeconfig, backends_extra={"pod_annotations": {
        "pod-complete.stage.kwok.x-k8s.io/delay": "15s"}})  # fmt: skip
    runs = [rt.submit(rt.spec(("x",), project="p", request=ResourceRequest(gpus=1)))
            for _ in range(3)]  # fmt: skip
    ctl = Controller(rt)
    drive(rt, ctl, lambda: all(get(rt, r).phase is Phase.RUNNING for r in runs))
    pid_file = Path(kubeconfig).parent / "pids" / "kube-apiserver.pid"
    pid = int(pid_file.read_text().strip())
    # SIGTERM is a graceful stop: kube-apiserver may drain its open watches for up to a minute
    # (slow CI machines took longer), so it is escalated to SIGKILL after 15 s. Either way the
    # API is gone; what matters is that ticks while it is away change nothing.
    os.kill(pid, signal.SIGTERM)
    started = time.time()
    killed = False
    try:
        while True:
            ctl.tick()
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                state = stat.rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                break  # gone, its port free again
            if state in ("Z", "X"):
                break  # exited, not yet reaped by init: its port is free
            if not killed and time.time() - started > 15:
                os.kill(pid, signal.SIGKILL)
                killed = True
            assert time.time() - started < 60, "kube-apiserver did not stop"
            time.sleep(0.2)
        assert all(get(rt, r).phase is Phase.RUNNING for r in runs)
    finally:  # bring the API back whatever happened, or every later k8s test fails too
        subprocess.run(["bash", str(REPO / "scripts" / "k8s.sh"), "start"], check=True,
                       capture_output=True, timeout=600)  # fmt: skip
    drive(rt, ctl, lambda: all(get(rt, r).phase in TERMINAL_PHASES for r in runs), 180)
    assert all(get(rt, r).phase is Phase.SUCCEEDED and get(rt, r).attempt == 1 for r in runs)


@pytest.mark.slurm
def test_one_quota_domain_across_local_slurm_and_kubernetes(
    tmp_path: Path, kubeconfig: str, slurm_conf: str, clean: None
) -> None:
    """A project with 8 a100 and no borrowing, with a100 capacity on all three backends, never
    holds more than 8 across them while 24 runs of 2 GPUs go through (8 pinned to each)."""
    rt = k8s_runtime(tmp_path, kubeconfig, projects={"p": (8, 0)}, backends_extra={
        "pod_annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "2s"}})  # fmt: skip
    data = yaml.safe_load(Path(str(rt.cfg.source)).read_text())
    data["backends"]["hpc"] = {
        "type": "slurm",
        "slurm_conf": slurm_conf,
        "inventory_s": 0,
        "gres_types": {"a100-80gb": "a100", "h100-80gb": "h100"},
    }
    data["backends"]["local"] = {"type": "local", "nodes": [
        {"name": "virt", "gpu_type": "a100-80gb", "gpus": 8}]}  # fmt: skip
    Path(str(rt.cfg.source)).write_text(yaml.safe_dump(data))
    rt = Runtime.load(rt.cfg.source)
    want = ResourceRequest(gpus=2, gpu_types=("a100-80gb",))
    pins = ("local", "hpc", "k8s")
    runs = [rt.submit(rt.spec(("sleep", "2"), project="p", request=want, backend=pins[i % 3]))
            for i in range(24)]  # fmt: skip
    held: list[float] = []
    seen: set[str] = set()
    ctl = Controller(rt)
    deadline = time.time() + 300
    while not all(get(rt, r).phase in TERMINAL_PHASES for r in runs):
        assert time.time() < deadline, "the runs did not finish"
        ctl.tick()
        active = [r for r in rt.store.list_runs(ACTIVE_PHASES) if r.placement]
        held.append(sum(r.placement.gpu_amount for r in active if r.placement))
        seen.update(r.placement.backend for r in active if r.placement)
        time.sleep(0.2)
    assert {get(rt, r).phase for r in runs} == {Phase.SUCCEEDED}
    assert max(held) == 8 and seen == {"local", "hpc", "k8s"}


def test_the_job_cache_follows_creations_changes_and_deletions(
    kubeconfig: str, clean: None
) -> None:
    """The watch cache behind poll: synced after its first list, then each Job created, changed
    or deleted elsewhere shows within seconds, without a list per read."""
    from kubernetes import client

    from mlops_gpu.backends.k8s import SELECTOR, KubernetesBackend

    backend = KubernetesBackend("k8s", kubeconfig=kubeconfig)
    _, batch, _ = backend._clients()
    assert backend._jobs(batch, {}) == {}  # the first read lists and starts the watch
    cache = backend._cache
    assert cache is not None

    def until(cond: Callable[[dict[str, Any]], bool]) -> None:
        deadline = time.time() + 20
        while time.time() < deadline:
            jobs = cache.jobs()
            if jobs is not None and cond(jobs):
                return
            time.sleep(0.1)
        raise AssertionError(f"the cache did not follow: {sorted(cache.jobs() or {})}")

    until(lambda jobs: True)  # synced
    labels = dict(s.split("=") for s in SELECTOR.split(","))
    body = {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "cache-probe", "labels": labels},
            "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "x"}]}}}}  # fmt: skip
    batch.create_namespaced_job("default", body)
    until(lambda jobs: "cache-probe" in jobs)
    batch.patch_namespaced_job("cache-probe", "default", {"metadata": {"annotations": {"x": "1"}}})
    until(lambda jobs: (jobs.get("cache-probe", {})["metadata"].get("annotations") or {}).get("x")
          == "1")  # fmt: skip
    bg = client.V1DeleteOptions(propagation_policy="Background")
    batch.delete_namespaced_job("cache-probe", "default", body=bg)
    until(lambda jobs: "cache-probe" not in jobs)


def test_warm_connects_reads_the_nodes_and_syncs_the_job_watch_before_any_run(
    kubeconfig: str,
) -> None:
    """``warm`` (the daemon's hook at start and before each tick): after it, with no run ever
    launched, the nodes are read and the Job watch syncs, so a first burst's poll lists no
    Jobs; called again it starts nothing new."""
    from mlops_gpu.backends import warm
    from mlops_gpu.backends.k8s import KubernetesBackend

    backend = KubernetesBackend("k8s", kubeconfig=kubeconfig)
    assert backend._cache is None and backend._api is None
    warm(backend)
    assert backend._api is not None and len(backend._inventory) >= 100
    cache = backend._cache
    assert cache is not None
    deadline = time.time() + 20
    while cache._synced is False and time.time() < deadline:
        time.sleep(0.1)
    assert cache._synced, "the Job watch did not sync after warm"
    thread = cache._thread
    warm(backend)
    assert backend._cache is cache and cache._thread is thread  # the same watch, kept going
