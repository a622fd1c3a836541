"""Submit-time checks: is a request well formed and could this cluster ever host it?

Pure: the caller passes the configured projects, GPU types, priority classes and the nodes the
backends report. Each problem is one sentence naming the field at fault.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mlops_gpu.core.placement import empty_cluster, place
from mlops_gpu.model import BackendCapabilities, GpuType, Node, Phase, Project, Run, RunSpec


def request_problems(
    spec: RunSpec,
    *,
    projects: Mapping[str, Project],
    gpu_types: Mapping[str, GpuType],
    priority_classes: Mapping[str, int],
    nodes: Iterable[Node],
    backends: Iterable[str] = (),
    capabilities: Mapping[str, BackendCapabilities] | None = None,
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
    nodes = tuple(nodes)
    caps = dict(capabilities or {})
    probe = Run(id="probe", seq=0, spec=spec, phase=Phase.PENDING, attempt=1, submitted_at=0.0)
    types = [t for t in sorted({n.gpu_type for n in nodes}) if spec.request.accepts(t)]
    empty = empty_cluster(nodes, caps)
    if any(place(*empty, probe, t) is not None for t in types):
        return out
    out.append(_why_unhostable(spec, nodes, caps))
    return out


def _why_unhostable(
    spec: RunSpec, nodes: tuple[Node, ...], caps: Mapping[str, BackendCapabilities]
) -> str:
    """The most specific sentence for a request no backend can host."""
    req = spec.request
    ok = [
        n
        for n in nodes
        if req.accepts(n.gpu_type) and (spec.backend is None or n.backend == spec.backend)
    ]
    types = "/".join(req.gpu_types) or "any type"
    default = BackendCapabilities()
    if req.shape == "mig":
        return (
            f"mig: no node of {types} on a MIG-capable backend offers {req.gpus} {req.mig} slice(s)"
        )
    if req.shape == "shared":
        return (
            f"gpu_fraction/gpu_memory: no shared node of {types} on a backend that shares "
            "GPUs can host it"
            + (" (memory cap larger than the devices)" if req.gpu_memory_mb else "")
        )
    roomy = [
        n
        for n in ok
        if (n.cpu_milli is None or req.cpu_milli <= n.cpu_milli)
        and (n.host_memory_mb is None or req.host_memory_mb <= n.host_memory_mb)
    ]
    if ok and not roomy:
        return (
            f"cpu_milli/host_memory_mb: {req.cpu_milli}m CPU and {req.host_memory_mb} MB "
            f"memory per node requested, but no node of {types} has that much"
        )
    if req.shape == "cpu":
        return "no node can host this CPU-only run"
    biggest = max((n.capacity for n in ok), default=0)
    if biggest < req.gpus:
        return (
            f"gpus: {req.gpus} GPUs per node of {types} requested, but the largest node "
            f"has {biggest}"
        )
    if req.nodes > 1 and not any(caps.get(n.backend, default).multi_node for n in ok):
        backends = ", ".join(sorted({n.backend for n in ok}))
        return f"nodes: {req.nodes}-node gangs need a multi-node backend; configured: {backends}"
    return (
        f"nodes: {req.nodes} nodes with {req.gpus} GPUs of {types} requested, but no "
        "backend has that many such nodes"
        + (f" sharing label {req.topology_key!r}" if req.topology_required else "")
    )
