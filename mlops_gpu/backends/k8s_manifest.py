"""What the Kubernetes backend creates for a run: one ``batch/v1`` Job, as a plain dict (no
client import here, so it is golden-file tested without a cluster).

Pinning the core's placement (no kube-scheduler decision anywhere):
- one node: the pod template's ``nodeName`` is the chosen node, so the kubelet (or kwok) takes
  the pod at once;
- a gang of N nodes: an Indexed Job (completions = parallelism = N) whose pods name
  ``schedulerName: mlops-gpu``; no scheduler watches that name, and the backend binds pod
  ``i`` to the placement's node ``i`` (the Binding subresource). Kubernetes starts the N pods
  only once they are bound; the core admitted all N nodes at once or none.

Invariants:
- Names are ``mlops-gpu-<run id>-<attempt>`` (run ids are lowercase hex: valid DNS-1123
  labels). User-given text (the run's name, its project) goes into label values only after
  ``label_value`` (at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both ends) and, whole, into
  annotations, which take any string.
- Labels ``mlops-gpu/run-id`` and ``mlops-gpu/attempt`` let a restarted scheduler find its Jobs.
- ``terminationGracePeriodSeconds`` is the run's checkpoint grace; the container runs the
  ``mlops-gpu exec`` launcher with ``--term-signal`` set to the run's checkpoint signal, so the
  kubelet's SIGTERM reaches the run as that signal.
- ``backoffLimit: 0`` and ``restartPolicy: Never``: retrying is the scheduler's, not the Job
  controller's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mlops_gpu.backends.base import LaunchError, LaunchRequest

MANAGED_BY = "mlops-gpu"
SCHEDULER_NAME = "mlops-gpu"
GPU_RESOURCE = "nvidia.com/gpu"
_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*\Z")


def job_name(run_id: str, attempt: int) -> str:
    return f"mlops-gpu-{run_id}-{attempt}"


def label_value(text: str) -> str:
    """A valid label value for any text: runs of other characters become ``-``, at most 63
    characters, alphanumeric at both ends (empty if nothing is left)."""
    v = _LABEL_BAD.sub("-", text)[:63]
    return v.strip("-_.")


def dns_label(text: str, limit: int = 63) -> str:
    """A DNS-1123 label for any text: lowercase alphanumerics and ``-``, alphanumeric at both
    ends; ``x`` when nothing is left."""
    v = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:limit].strip("-")
    return v or "x"


@dataclass(frozen=True, slots=True)
class PodSettings:
    """Where and how a run's pod runs: from the backend's config, or the submit."""

    namespace: str = "default"
    image: str = "python:3.11-slim"
    #: The Python inside the image that runs the launcher.
    python: str = "python3"
    service_account: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: Kubernetes volume and volumeMount dicts, passed through as given.
    volumes: Sequence[Mapping[str, Any]] = ()
    volume_mounts: Sequence[Mapping[str, Any]] = ()
    #: Extra pod annotations (e.g. kwok's ``pod-complete.stage.kwok.x-k8s.io/delay`` in tests).
    annotations: Mapping[str, str] = field(default_factory=dict)
    image_pull_policy: str = "IfNotPresent"


def job_manifest(req: LaunchRequest, pod: PodSettings, env: Mapping[str, str]) -> dict[str, Any]:
    """The Job for one attempt of a run, pinned to its placement."""
    p, spec = req.placement, req.spec
    per_node = {len(s.devices) for s in p.slots}
    if len(per_node) != 1:
        raise LaunchError("a gang's pods all take the same GPUs; this placement does not")
    (gpus,) = per_node
    for name in env:
        if not _ENV_NAME.match(name):
            raise LaunchError(f"environment variable name {name!r} is not valid in a pod")
    name = job_name(req.run_id, req.attempt)
    labels = {
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "mlops-gpu/run-id": req.run_id,
        "mlops-gpu/attempt": str(req.attempt),
        "mlops-gpu/project": label_value(spec.project),
        "mlops-gpu/name": label_value(spec.name),
    }
    annotations = {"mlops-gpu/run-name": spec.name, "mlops-gpu/project": spec.project,
                   "mlops-gpu/nodes": ",".join(p.node_names), **pod.annotations}  # fmt: skip
    launcher = req.launcher
    command: list[str] = list(spec.command)
    if launcher is not None:
        sig = spec.checkpoint.signal
        term = None if sig.upper() in ("SIGTERM", "TERM") else sig  # the kubelet's SIGTERM
        launcher = replace(launcher, term_signal=term)
        command = launcher.argv(pod.python, spec.command, None)
    limits: dict[str, str] = {}
    if spec.request.mig is not None:
        limits[f"nvidia.com/mig-{spec.request.mig}"] = "1"
    elif gpus:
        limits[GPU_RESOURCE] = str(gpus)
    requests: dict[str, str] = {}
    if spec.request.cpu_milli:
        requests["cpu"] = f"{spec.request.cpu_milli}m"
    if spec.request.host_memory_mb:
        requests["memory"] = f"{spec.request.host_memory_mb}Mi"
    container: dict[str, Any] = {
        "name": "run",
        "image": pod.image,
        "imagePullPolicy": pod.image_pull_policy,
        "command": command,
        "env": [{"name": k, "value": v} for k, v in sorted({**pod.env, **env}.items())],
        "resources": {"limits": limits, **({"requests": requests} if requests else {})},
    }
    if spec.workdir:
        container["workingDir"] = spec.workdir
    if pod.volume_mounts:
        container["volumeMounts"] = [dict(m) for m in pod.volume_mounts]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": max(round(spec.checkpoint.grace_s), 0),
        "containers": [container],
    }
    if spec.max_runtime_s is not None:
        pod_spec["activeDeadlineSeconds"] = int(spec.max_runtime_s + spec.checkpoint.grace_s) + 1
    if pod.service_account:
        pod_spec["serviceAccountName"] = pod.service_account
    if pod.volumes:
        pod_spec["volumes"] = [dict(v) for v in pod.volumes]
    n = len(p.slots)
    job_spec: dict[str, Any] = {"backoffLimit": 0, "completions": n, "parallelism": n}
    if n == 1:
        pod_spec["nodeName"] = p.slots[0].node
    else:  # bound pod by pod to the placement's nodes by the backend
        pod_spec["schedulerName"] = SCHEDULER_NAME
        job_spec["completionMode"] = "Indexed"
    job_spec["template"] = {"metadata": {"labels": dict(labels), "annotations": annotations},
                            "spec": pod_spec}  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": pod.namespace,
            "labels": labels,
            "annotations": dict(annotations),
        },
        "spec": job_spec,
    }
