"""Submit-time checks: is a request well formed and could this cluster ever host it?

Pure: the caller passes the configured projects, GPU types, priority classes and the nodes the
backends report. Each problem is one sentence naming the field at fault.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mlops_gpu.model import GpuType, Node, Project, RunSpec


def request_problems(
    spec: RunSpec,
    *,
    projects: Mapping[str, Project],
    gpu_types: Mapping[str, GpuType],
    priority_classes: Mapping[str, int],
    nodes: Iterable[Node],
    backends: Iterable[str] = (),
) -> list[str]:
    out = list(spec.request.problems())
    if spec.project not in projects:
        known = ", ".join(sorted(projects)) or "none configured"
        out.append(f"project: unknown project {spec.project!r} (known: {known})")
    if spec.priority not in priority_classes:
        known = ", ".join(sorted(priority_classes))
        out.append(f"priority: unknown priority class {spec.priority!r} (known: {known})")
    for t in spec.request.gpu_types:
        if t not in gpu_types:
            known = ", ".join(sorted(gpu_types))
            out.append(f"gpu_type: unknown GPU type {t!r} (known: {known})")
    backend_names = set(backends)
    if spec.backend is not None and backend_names and spec.backend not in backend_names:
        out.append(f"backend: unknown backend {spec.backend!r}")
    if spec.max_runtime_s is not None and spec.max_runtime_s <= 0:
        out.append(f"max_runtime: must be positive, got {spec.max_runtime_s}")
    if spec.checkpoint.grace_s < 0:
        out.append(f"grace: must not be negative, got {spec.checkpoint.grace_s}")
    if not spec.command:
        out.append("command: empty command")
    if out:
        return out
    req = spec.request
    if req.gpus > 0:
        per_backend: dict[str, int] = {}
        biggest = 0
        for n in nodes:
            if not req.accepts(n.gpu_type) or (spec.backend and n.backend != spec.backend):
                continue
            biggest = max(biggest, n.capacity)
            if n.capacity >= req.gpus:
                per_backend[n.backend] = per_backend.get(n.backend, 0) + 1
        if not any(c >= req.nodes for c in per_backend.values()):
            types = "/".join(req.gpu_types) or "any type"
            if biggest < req.gpus:
                out.append(
                    f"gpus: {req.gpus} GPUs per node of {types} requested, but the largest "
                    f"node has {biggest}"
                )
            else:
                out.append(
                    f"nodes: {req.nodes} nodes with {req.gpus} GPUs of {types} requested, but "
                    "no backend has that many such nodes"
                )
    return out
