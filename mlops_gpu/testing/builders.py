"""Value builders for tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import yaml

from mlops_gpu.core import PolicySettings, Snapshot
from mlops_gpu.model import (
    BackendCapabilities,
    Budget,
    CheckpointPolicy,
    Cohort,
    GpuType,
    Node,
    NodeSlot,
    Phase,
    Placement,
    Project,
    Quota,
    ResourceRequest,
    Run,
    RunSpec,
)

DEFAULT_PRIORITIES: Mapping[str, int] = {"low": 0, "normal": 100, "high": 1000}


def make_node(
    name: str = "n1", gpus: int = 4, gpu_type: str = "a100-80gb", backend: str = "local", **kw: Any
) -> Node:
    return Node(
        name=name,
        backend=backend,
        gpu_type=gpu_type,
        devices=tuple(str(i) for i in range(gpus)),
        **kw,
    )


def make_project(
    name: str = "p",
    nominal: int = 8,
    borrowing_limit: int | None = 0,
    gpu_type: str = "a100-80gb",
    cohort: str | None = None,
    quotas: Mapping[str, Quota] | None = None,
    weight: float = 1.0,
    budget: Budget | None = None,
) -> Project:
    q = dict(quotas) if quotas is not None else {gpu_type: Quota(nominal, borrowing_limit)}
    return Project(
        name=name, cohort=cohort, weight=weight, quotas=MappingProxyType(q), budget=budget
    )


_REQUEST_KEYS = (
    "gpu_fraction",
    "gpu_memory_mb",
    "mig",
    "topology_key",
    "topology_required",
    "cpu_milli",
    "host_memory_mb",
)
_RUN_KEYS = (
    "attempt",
    "admitted_at",
    "started_at",
    "last_checkpoint_at",
    "attained_gpu_s",
    "not_before",
    "preempt_requested",
    "cancel_requested",
    "handle",
    "held",
)


def make_spec(
    project: str = "p",
    gpus: int = 1,
    nodes: int = 1,
    *,
    name: str = "job",
    command: Sequence[str] = ("true",),
    gpu_types: Iterable[str] = (),
    priority: str = "normal",
    **kw: Any,
) -> RunSpec:
    """A run spec; request fields (``mig``, ``gpu_fraction``, ``topology_key``, ...) may be
    given directly."""
    req = {k: kw.pop(k) for k in _REQUEST_KEYS if k in kw}
    grace = kw.pop("grace_s", None)
    checkpoint = kw.pop(
        "checkpoint", CheckpointPolicy() if grace is None else CheckpointPolicy(grace_s=grace)
    )
    return RunSpec(
        name=name,
        project=project,
        user="tester",
        command=tuple(command),
        request=ResourceRequest(gpus=gpus, nodes=nodes, gpu_types=tuple(gpu_types), **req),
        priority=priority,
        checkpoint=checkpoint,
        **kw,
    )


def make_run(
    run_id: str,
    project: str = "p",
    gpus: int = 1,
    nodes: int = 1,
    *,
    seq: int = 0,
    submitted_at: float = 0.0,
    priority: str = "normal",
    phase: Phase = Phase.PENDING,
    placement: Placement | None = None,
    gpu_types: Iterable[str] = (),
    **kw: Any,
) -> Run:
    """A run record; ``Run`` fields (``started_at``, ``attained_gpu_s``, ...) and spec fields
    may both be given. An active run without ``admitted_at`` was admitted at time 0."""
    run_kw = {k: kw.pop(k) for k in _RUN_KEYS if k in kw}
    if phase is not Phase.PENDING:
        run_kw.setdefault("admitted_at", 0.0)
        run_kw.setdefault("started_at", run_kw["admitted_at"])
    spec = make_spec(
        project, gpus, nodes, name=run_id, gpu_types=gpu_types, priority=priority, **kw
    )
    return Run(
        id=run_id,
        seq=seq,
        spec=spec,
        phase=phase,
        submitted_at=submitted_at,
        placement=placement,
        **{"attempt": 1, **run_kw},
    )


def placed(
    node: str,
    devices: Sequence[str],
    gpu_type: str = "a100-80gb",
    backend: str = "local",
    fraction: float = 1.0,
    memory_mb: int | None = None,
) -> Placement:
    slot = NodeSlot(node, tuple(devices), fraction, memory_mb)
    return Placement(backend=backend, gpu_type=gpu_type, slots=(slot,))


def placed_gang(
    slots: Sequence[tuple[str, Sequence[str]]],
    gpu_type: str = "a100-80gb",
    backend: str = "local",
) -> Placement:
    return Placement(backend, gpu_type, tuple(NodeSlot(n, tuple(d)) for n, d in slots))


def make_snapshot(
    nodes: Sequence[Node],
    projects: Sequence[Project],
    pending: Sequence[Run] = (),
    active: Sequence[Run] = (),
    *,
    now: float = 1000.0,
    queueing: str = "best-effort-fifo",
    gpu_types: Iterable[str] | None = None,
    capabilities: Mapping[str, BackendCapabilities] | None = None,
    cohorts: Iterable[str] = (),
    usage_history: Mapping[tuple[str, str], float] | None = None,
    spent: Mapping[str, tuple[float, float]] | None = None,
    **policy: Any,
) -> Snapshot:
    """A snapshot; backends can do everything (gangs, MIG, sharing) unless ``capabilities``
    says otherwise; ``policy`` overrides ``PolicySettings`` fields. Cohorts named by projects
    exist (as roots) unless given."""
    types = set(gpu_types or ()) | {n.gpu_type for n in nodes}
    if capabilities is None:
        capabilities = {
            n.backend: BackendCapabilities(multi_node=True, mig=True, shared_gpus=True)
            for n in nodes
        }
    names = set(cohorts) | {p.cohort for p in projects if p.cohort is not None}
    return Snapshot(
        now=now,
        nodes=tuple(nodes),
        pending=tuple(pending),
        active=tuple(active),
        projects={p.name: p for p in projects},
        gpu_types={t: GpuType(t, 1.0) for t in sorted(types)},
        priority_classes=dict(DEFAULT_PRIORITIES),
        cohorts={c: Cohort(c) for c in sorted(names)},
        policy=PolicySettings(queueing=queueing, **policy),
        capabilities=capabilities,
        usage_history=dict(usage_history or {}),
        spent=dict(spent or {}),
    )


def config_yaml(
    *,
    nodes: Sequence[tuple[str, int]] = (("node-a", 4),),
    projects: Mapping[str, tuple[int, int | None]] | None = None,
    gpu_type: str = "a100-80gb",
    extra: Mapping[str, Any] | None = None,
    cohort: bool = True,
) -> str:
    """A valid config file's text: local virtual nodes, projects name -> (nominal, borrow)."""
    projects = projects or {"p": (4, 0)}
    data: dict[str, Any] = {
        "store": "sqlite:///state.db",
        "state_dir": "state",
        "gpu_types": {gpu_type: {"price_per_hour": 2.5}},
        "backends": {
            "local": {
                "type": "local",
                "nodes": [{"name": n, "gpu_type": gpu_type, "gpus": g} for n, g in nodes],
            }
        },
        "cohorts": {"org": {}} if cohort else {},
        "projects": {
            name: {
                "cohort": "org" if cohort else None,
                "quotas": {gpu_type: {"nominal": nom, "borrowing_limit": b}},
            }
            for name, (nom, b) in projects.items()
        },
        "scheduler": {"tick_s": 0.1},
    }
    data.update(extra or {})
    return yaml.safe_dump(data, sort_keys=False)
