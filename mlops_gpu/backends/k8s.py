"""The ``kubernetes`` backend: runs as ``batch/v1`` Jobs pinned to the core's placement, through
the official ``kubernetes`` client (imported on first use).

- Inventory: Nodes with allocatable ``nvidia.com/gpu`` (or ``nvidia.com/mig-<profile>``), the GPU
  model from the ``nvidia.com/gpu.product`` label mapped to our GPU type (``gpu_models``);
  cordoned or NotReady nodes, and nodes an autoscaler (Karpenter) taints as registering or
  being removed, are listed unschedulable. Cached ``inventory_s``.
- Elastic pools: ``capacity`` (``k8s_capacity``) asks an autoscaler for nodes with placeholder
  pods.
- Launch: one Job per attempt (``k8s_manifest``): ``nodeName`` for one node; for a gang an
  Indexed Job with ``schedulerName: mlops-gpu`` whose pod ``i`` this backend binds to the
  placement's node ``i`` (the Binding subresource) when it polls.
- Status: our Jobs from a list-and-watch cache (``k8s_watch``; one list per poll while it is
  not synced), whatever the number of runs; a Job runs when its ``status.ready`` reaches its
  parallelism. Pods are listed only for the Jobs that need them (being stopped, failed: the
  exit code, gangs to bind), in the same poll. A Job that is gone, or placed on a node that no
  longer exists, is ``lost``; one this backend created under ``UNSEEN_GRACE_S`` ago and not
  yet in the cache is starting.
- Stop: the Job is deleted (foreground propagation, so it lasts until its pods are gone and the
  run holds its GPUs through the grace) and its pods with the grace period of the stop; the
  kubelet sends SIGTERM, which the launcher passes on as the run's checkpoint signal, then
  SIGKILL after the grace. ``deletionGracePeriodSeconds`` on the pod shows it.
- A cluster that does not answer: the inventory keeps the last nodes seen, and the controller
  leaves the runs as they are until it answers again.
- Every API call takes a token from a bucket of ``api_qps``/``api_burst`` (as client-go's
  clients do), so the backend's load on the API server is bounded and comparable.
- Handles: ``k8s:<context>:<namespace>:<job name>``; before deleting, the handle must be this
  backend's and the Job must carry our labels.

Reconcile after a restart: ``find`` looks the Job up by its name (run id and attempt).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from mlops_gpu.backends.base import (
    HandleError,
    JobState,
    JobStatus,
    LaunchError,
    LaunchRequest,
    job_env,
)
from mlops_gpu.backends.k8s_capacity import LEAVING_TAINT, STARTING_TAINT, Placeholders
from mlops_gpu.backends.k8s_manifest import (
    GPU_RESOURCE,
    MANAGED_BY,
    SCHEDULER_NAME,
    PodSettings,
    job_manifest,
    job_name,
)
from mlops_gpu.backends.k8s_watch import JobCache
from mlops_gpu.backends.rate_limit import TokenBucket
from mlops_gpu.model import BackendCapabilities, Node

PRODUCT_LABEL = "nvidia.com/gpu.product"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
#: How long a Job this backend created may be missing from the watch cache before a poll
#: reads it directly (and calls it lost if it is gone).
UNSEEN_GRACE_S = 30.0


class KubernetesBackend:
    kind = "kubernetes"
    capabilities = BackendCapabilities(
        multi_node=True,
        mig=True,
        shared_gpus=False,
        checkpoint_signal=True,
        parallel_launch=True,  # each launch is an API round trip
        starts_at_once=False,  # a pod takes seconds to start
    )

    def __init__(
        self,
        name: str,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        pod: PodSettings | None = None,
        gpu_models: Mapping[str, str] | None = None,
        inventory_s: float = 10.0,
        checkpoint_dir: str = "/tmp/mlops-gpu-checkpoints",
        api_qps: float = 50.0,
        api_burst: int = 100,
    ) -> None:
        self.name = name
        self.kubeconfig, self.context = kubeconfig, context
        self.pod = pod or PodSettings()
        self.gpu_models = dict(gpu_models or {})
        self.inventory_s = inventory_s
        self.checkpoint_dir = checkpoint_dir
        self._api: Any = None
        self._inventory: list[Node] = []
        self._inventory_at = float("-inf")
        self._node_names: set[str] = set()
        self._bucket = TokenBucket(api_qps, api_burst)
        self._cache: JobCache | None = None
        #: Job name -> when this backend created it, until the cache has it.
        self._created: dict[str, float] = {}
        self._unseen: set[str] = set()
        #: elastic pools: placeholder pods that show an autoscaler the nodes the pools want
        self.capacity = Placeholders(self._clients, self._get, self._send, self.pod.namespace)

    # -- the client -----------------------------------------------------------------------
    def _clients(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=self.kubeconfig, context=self.context
            )
            if self.context is None:
                _, active = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                    config_file=self.kubeconfig
                )
                self.context = active["name"]
            self._api = (client.CoreV1Api(api_client), client.BatchV1Api(api_client), client)
        return self._api

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        self._bucket.take()
        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            raise _ApiError(what, e.status, str(e.reason)) from None
        except (HTTPError, OSError) as e:
            raise _ApiError(what, 0, str(e)) from None

    def _get(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A read as plain JSON: the client's model classes cost more CPU to build than the
        call takes (0.5 s for a list of 800 pods), and every poll lists every run's pods."""
        resp = self._call(what, fn, *args, _preload_content=False, **kwargs)
        try:
            out: dict[str, Any] = json.loads(resp.data)
        except ValueError as e:
            raise _ApiError(what, 0, f"not JSON: {e}") from None
        finally:
            resp.release_conn()  # unread answers keep their connection out of the pool
        return out

    def _send(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        """A write whose answer is not needed: it is not parsed (a V1Job costs more CPU to
        build than the call takes; Binding's empty answer does not parse at all), and its
        connection goes back to the pool (else the next call opens one: a TLS handshake)."""
        resp = self._call(what, fn, *args, _preload_content=False, **kwargs)
        resp.drain_conn()
        resp.release_conn()

    # -- interface ------------------------------------------------------------------------
    def warm(self) -> None:
        """Be ready before there is work (``base.warm``): the client imported (about a second of
        CPU the first time), the nodes read, the Job watch running and kept running, so that a
        first burst of runs is launched at once and its first poll reads the watch's cache
        instead of listing every Job while they are being created."""
        _, batch, _ = self._clients()
        self.inventory()
        self._job_cache(batch).touch()

    def inventory(self) -> list[Node]:
        now = time.monotonic()
        if now - self._inventory_at < self.inventory_s:
            return list(self._inventory)
        core, _, _ = self._clients()
        nodes = []
        names = set()
        try:
            listed = self._get("list nodes", core.list_node)["items"]
        except _ApiError:
            if self._inventory_at == float("-inf"):
                raise
            return list(self._inventory)  # the API is away: the last nodes seen stand
        for n in listed:
            meta, status = n["metadata"], n.get("status") or {}
            names.add(meta["name"])
            alloc = status.get("allocatable") or {}
            labels = dict(meta.get("labels") or {})
            model = labels.get(PRODUCT_LABEL, "")
            gpu_type = self.gpu_models.get(model, model)
            whole = int(alloc.get(GPU_RESOURCE, "0") or 0)
            mig = {
                k.removeprefix("nvidia.com/mig-"): tuple(
                    f"{k.removeprefix('nvidia.com/mig-')}-{i}" for i in range(int(v))
                )
                for k, v in alloc.items()
                if k.startswith("nvidia.com/mig-") and int(v or 0) > 0
            }
            if not whole and not mig:
                continue
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (status.get("conditions") or []))  # fmt: skip
            cordoned = bool((n.get("spec") or {}).get("unschedulable"))
            why = "cordoned" if cordoned else ("" if ready else "NotReady")
            taints = {t.get("key") for t in (n.get("spec") or {}).get("taints") or []}
            if not why and STARTING_TAINT in taints:  # an autoscaler's node, registering
                why = "registering"
            elif not why and LEAVING_TAINT in taints:  # the autoscaler is removing it
                why = "being removed by the autoscaler"
            nodes.append(
                Node(
                    name=meta["name"],
                    backend=self.name,
                    gpu_type=gpu_type or "gpu",
                    devices=tuple(str(i) for i in range(whole)),
                    labels=labels,
                    schedulable=not why,
                    state_reason=why,
                    mig=mig,
                )
            )
        self._inventory, self._inventory_at, self._node_names = nodes, now, names
        return list(nodes)

    def launch(self, req: LaunchRequest) -> str:
        _, batch, _ = self._clients()
        env = job_env(req, f"{self.checkpoint_dir}/{req.run_id}")
        manifest = job_manifest(req, self.pod, env)
        try:
            self._send("create job", batch.create_namespaced_job, self.pod.namespace, manifest)
            self._created[manifest["metadata"]["name"]] = time.monotonic()
        except _ApiError as e:
            if e.status != 409:  # 409: it exists already (a retried launch): adopt it
                raise LaunchError(str(e)) from None
        return self._handle(manifest["metadata"]["name"])

    def poll(self, handles: Sequence[str]) -> dict[str, JobStatus]:
        if not handles:
            return {}
        core, batch, _ = self._clients()
        names = {self._parse(h): h for h in handles}
        jobs = self._jobs(batch, names)
        pods: dict[str, list[Any]] = {}
        want = sorted(n for n, j in jobs.items() if _needs_pods(j))
        if want:  # most polls need none: a running Job's own status says it runs
            sel = SELECTOR + (f",job-name in ({','.join(want)})" if len(want) <= 50 else "")
            for p in self._get("list pods", core.list_namespaced_pod, self.pod.namespace,
                               label_selector=sel)["items"]:  # fmt: skip
                owner = (p["metadata"].get("labels") or {}).get("job-name", "")
                if owner in names:
                    pods.setdefault(owner, []).append(p)
        self.inventory()  # the node names, for pods on nodes that vanished
        out = {}
        for name, handle in names.items():
            job = jobs.get(name)
            if job is None and name in self._unseen:
                out[handle] = JobStatus(handle, JobState.STARTING)  # created, not yet in cache
                continue
            out[handle] = self._status(handle, job, pods.get(name, []))
        return out

    def _job_cache(self, batch: Any) -> JobCache:
        if self._cache is None:
            self._cache = JobCache(self._call, batch, self.pod.namespace, SELECTOR)
        return self._cache

    def _jobs(self, batch: Any, names: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """Our Jobs among ``names``: from the watch cache when it is synced, else one list. A Job
        the cache lacks is read directly, unless this backend created it less than
        ``UNSEEN_GRACE_S`` ago (``_unseen``: it is starting)."""
        cached = self._job_cache(batch).jobs()
        if cached is None:
            listed = self._get("list jobs", batch.list_namespaced_job, self.pod.namespace,
                               label_selector=SELECTOR)["items"]  # fmt: skip
            return {j["metadata"]["name"]: j for j in listed if j["metadata"]["name"] in names}
        jobs = {n: cached[n] for n in names if n in cached}
        now = time.monotonic()
        self._unseen.clear()
        for name, at in list(self._created.items()):
            if now - at >= UNSEEN_GRACE_S:
                del self._created[name]  # (never seen: read directly from now on)
        for name in names:
            if name in jobs:
                self._created.pop(name, None)
            elif now - self._created.get(name, float("-inf")) < UNSEEN_GRACE_S:
                # created by us a moment ago: its watch event is on its way (under load the
                # API server sends it seconds late); a read per such Job would add to the load
                self._unseen.add(name)
            else:
                try:
                    jobs[name] = self._get("read job", batch.read_namespaced_job, name,
                                           self.pod.namespace)  # fmt: skip
                except _ApiError as e:
                    if e.status != 404:
                        raise
        return jobs

    def cancel(self, handle: str, signal: str, grace_s: float) -> None:
        name = self._parse(handle)
        _, batch, client = self._clients()
        try:
            job = self._get("read job", batch.read_namespaced_job, name, self.pod.namespace)
        except _ApiError as e:
            if e.status == 404:
                return  # already gone
            raise HandleError(f"{handle}: {e}") from None
        if (job["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") != MANAGED_BY:
            raise HandleError(f"{handle}: Job {name} is not one of mlops-gpu's")
        # Foreground: the Job stays (being deleted) until its pods are gone, so the run holds
        # its GPUs through the grace period, as the node does
        body = client.V1DeleteOptions(propagation_policy="Foreground",
                                      grace_period_seconds=max(int(grace_s), 0))  # fmt: skip
        try:
            self._call("delete job", batch.delete_namespaced_job, name, self.pod.namespace,
                       body=body)  # fmt: skip
            # the pods carry the grace period (the Job's deletion alone would not stop them
            # with it): delete them too, each with the run's grace
            core, _, _ = self._clients()
            self._call("delete pods", core.delete_collection_namespaced_pod, self.pod.namespace,
                       label_selector=f"job-name={name}",
                       grace_period_seconds=max(int(grace_s), 0))  # fmt: skip
        except _ApiError as e:
            if e.status != 404:
                raise HandleError(f"{handle}: {e}") from None

    def find(self, run_id: str, attempt: int) -> str | None:
        _, batch, _ = self._clients()
        name = job_name(run_id, attempt)
        try:
            self._get("read job", batch.read_namespaced_job, name, self.pod.namespace)
        except _ApiError as e:
            if e.status == 404:
                return None
            raise
        return self._handle(name)

    def log_files(self, run_id: str, attempt: int) -> list[Path]:
        return []  # the pods' logs live in the cluster (kubectl logs job/<name>)

    # -- helpers --------------------------------------------------------------------------
    def _handle(self, name: str) -> str:
        self._clients()
        return f"k8s:{self.context}:{self.pod.namespace}:{name}"

    def _parse(self, handle: str) -> str:
        parts = handle.split(":")
        if len(parts) != 4 or parts[0] != "k8s":
            raise HandleError(f"{handle!r} is not a Kubernetes backend handle")
        self._clients()
        if parts[1] != self.context or parts[2] != self.pod.namespace:
            raise HandleError(f"{handle!r} belongs to {parts[1]}/{parts[2]}, not "
                              f"{self.context}/{self.pod.namespace}")  # fmt: skip
        return parts[3]

    def _status(
        self, handle: str, job: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> JobStatus:
        if job is None:
            return JobStatus(handle, JobState.LOST, reason="its Job was deleted")
        if job["metadata"].get("deletionTimestamp"):  # being stopped: until its pods end
            live = [p for p in pods if _phase(p) in ("Pending", "Running")]
            if live:
                return JobStatus(handle, JobState.RUNNING)
            return JobStatus(handle, JobState.FAILED, reason="stopped")
        st = job.get("status") or {}
        start = _ts(st.get("startTime"))
        for c in st.get("conditions") or []:
            if c.get("status") != "True":
                continue
            end = _ts(c.get("lastTransitionTime"))
            if c.get("type") == "Complete":
                return JobStatus(handle, JobState.SUCCEEDED, 0, start, end, "exited")
            if c.get("type") == "Failed":
                if c.get("reason") == "DeadlineExceeded":
                    return JobStatus(handle, JobState.FAILED, None, start, end, "max_runtime")
                code = _exit_code(pods)
                return JobStatus(handle, JobState.FAILED, code, start, end,
                                 c.get("message") or c.get("reason") or "failed")  # fmt: skip
        gone = [n for n in _nodes(job) if n not in self._node_names]
        if gone:
            # the Job controller would wait forever for a pod pinned to a missing node
            self._delete_quietly(job["metadata"]["name"])
            return JobStatus(handle, JobState.LOST, reason=f"its node {gone[0]} is gone")
        self._bind(job, pods)
        running = max(st.get("ready") or 0, sum(_phase(p) == "Running" for p in pods))
        if running >= ((job.get("spec") or {}).get("parallelism") or 1):
            return JobStatus(handle, JobState.RUNNING, started_at=start)
        return JobStatus(handle, JobState.STARTING)

    def _delete_quietly(self, name: str) -> None:
        _, batch, client = self._clients()
        body = client.V1DeleteOptions(propagation_policy="Background", grace_period_seconds=0)
        with contextlib.suppress(_ApiError):  # gone already, or the next poll tries again
            self._call("delete job", batch.delete_namespaced_job, name, self.pod.namespace,
                       body=body)  # fmt: skip

    def _bind(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """Bind a gang's waiting pods, pod ``i`` to the placement's node ``i``."""
        nodes = _nodes(job)
        core, _, client = self._clients()
        for p in pods:
            spec, meta = p.get("spec") or {}, p["metadata"]
            if spec.get("nodeName") or spec.get("schedulerName") != SCHEDULER_NAME:
                continue
            idx = (meta.get("annotations") or {}).get(INDEX_ANNOTATION)
            if idx is None or not idx.isdigit() or int(idx) >= len(nodes):
                continue
            target = client.V1ObjectReference(kind="Node", api_version="v1", name=nodes[int(idx)])
            body = client.V1Binding(metadata=client.V1ObjectMeta(name=meta["name"]),
                                    target=target)  # fmt: skip
            try:
                self._send("bind pod", core.create_namespaced_pod_binding, meta["name"],
                           self.pod.namespace, body)  # fmt: skip
            except _ApiError as e:
                if e.status != 409:  # 409: bound meanwhile
                    raise


def _exit_code(pods: list[dict[str, Any]]) -> int | None:
    for p in pods:
        for cs in (p.get("status") or {}).get("containerStatuses") or []:
            t = (cs.get("state") or {}).get("terminated")
            if t and t.get("exitCode"):
                return int(t["exitCode"])
    return None


def _nodes(job: dict[str, Any]) -> list[str]:
    """The placement's nodes, pod ``i`` on node ``i`` (the Job's ``mlops-gpu/nodes``)."""
    text = (job["metadata"].get("annotations") or {}).get("mlops-gpu/nodes") or ""
    return [n for n in text.split(",") if n]


def _needs_pods(job: dict[str, Any]) -> bool:
    """Whether the Job's status needs its pods: a stop (are they gone?), a failure (the exit
    code), a gang not yet running (pods to bind)."""
    if job["metadata"].get("deletionTimestamp"):
        return True
    st = job.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
            return bool(c.get("type") == "Failed")
    spec = job.get("spec") or {}
    gang = (spec.get("template") or {}).get("spec", {}).get("schedulerName") == SCHEDULER_NAME
    return gang and (st.get("ready") or 0) < (spec.get("parallelism") or 1)


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _ts(text: str | None) -> float | None:
    """An RFC 3339 time from the API (``2026-11-30T13:01:54Z``) as epoch seconds."""
    if not text:
        return None
    return datetime.fromisoformat(text).timestamp()


class _ApiError(RuntimeError):
    def __init__(self, what: str, status: int, reason: str) -> None:
        super().__init__(f"Kubernetes {what}: {status or ''} {reason}".strip())
        self.status = status
