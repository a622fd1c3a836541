"""What a user asks for (``RunSpec`` with its ``ResourceRequest``) and what the store knows of
a run (``Run``: spec + phase + attempt + times + placement + the latest scheduling reason).

Invariants:
- ``ResourceRequest.gpus`` is per node; a gang of ``nodes`` members holds ``gpus * nodes`` GPUs,
  all of one GPU type, all or nothing.
- Exactly one of whole ``gpus`` > 0, ``gpu_fraction``, or ``mig`` describes the GPU share
  (validated in ``ResourceRequest.problems``; the fractional and MIG shapes are placed by the
  full scheduling core); ``gpus`` 0 with host CPU or memory is a CPU-only run (shape ``cpu``)
  that holds no GPU.
- ``Run`` is a record read from the store; only the store creates new phases for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from mlops_gpu.model.cluster import Placement
from mlops_gpu.model.jobs import Dependency
from mlops_gpu.model.phase import Phase

_NO_ENV: Mapping[str, str] = MappingProxyType({})


class RunKind(str, Enum):
    TRAIN = "train"
    TUNE = "tune"
    NOTEBOOK = "notebook"
    SERVE = "serve"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    gpus: int = 1
    nodes: int = 1
    gpu_types: tuple[str, ...] = ()
    gpu_fraction: float | None = None
    gpu_memory_mb: int | None = None
    mig: str | None = None
    #: Node label whose value all gang members share (e.g. ``"rack"``): required, or only
    #: preferred when ``topology_required`` is False.
    topology_key: str | None = None
    topology_required: bool = False
    #: Host CPU (millicores) and memory per node; a node that tracks them must have them free.
    cpu_milli: int = 0
    host_memory_mb: int = 0

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes

    @property
    def shape(self) -> str:
        """``whole``, ``shared``, ``mig`` or ``cpu`` (no GPU): how the request takes GPUs."""
        if self.mig is not None:
            return "mig"
        if self.gpu_fraction is not None or self.gpu_memory_mb is not None:
            return "shared"
        if self.gpus == 0:
            return "cpu"
        return "whole"

    def accepts(self, gpu_type: str) -> bool:
        return not self.gpu_types or gpu_type in self.gpu_types

    def problems(self) -> list[str]:
        """Shape errors, each naming the offending field; empty when the request is well formed.

        Whole GPUs: ``gpus`` >= 1 per node. Shared: one device (``gpus`` 1) with a
        ``gpu_fraction`` and/or ``gpu_memory_mb``. MIG: ``gpus`` slices of profile ``mig``.
        """
        out: list[str] = []
        shared = self.gpu_fraction is not None or self.gpu_memory_mb is not None
        if self.nodes < 1:
            out.append(f"nodes must be at least 1, got {self.nodes}")
        if self.gpus < 0:
            out.append(f"gpus must not be negative, got {self.gpus}")
        elif self.gpus == 0 and (shared or self.mig is not None):
            out.append("gpus: a shared or MIG request takes at least one GPU, got gpus=0")
        elif self.gpus == 0 and self.cpu_milli <= 0 and self.host_memory_mb <= 0:
            out.append(
                "gpus must be a positive integer, got 0 (a CPU-only run needs cpu_milli or "
                "host_memory_mb)"
            )
        elif self.gpus == 0 and self.nodes != 1:
            out.append("nodes: a CPU-only run runs on one node")
        if self.gpu_fraction is not None and not 0 < self.gpu_fraction < 1:
            out.append(f"gpu_fraction must be in (0, 1), got {self.gpu_fraction}")
        if self.gpu_memory_mb is not None and self.gpu_memory_mb <= 0:
            out.append(f"gpu_memory must be positive, got {self.gpu_memory_mb}")
        if shared and self.mig is not None:
            out.append("mig: a MIG slice cannot also be a shared fraction or memory cap")
        if shared and self.gpus > 1:
            out.append(f"gpus: a shared request takes part of one GPU, got gpus={self.gpus}")
        if self.mig is not None and not re.fullmatch(r"\d+g\.\d+gb", self.mig):
            out.append(f"mig: expected a profile such as 1g.10gb, got {self.mig!r}")
        if (shared or self.mig is not None) and self.nodes != 1:
            out.append("nodes: fractional and MIG requests run on one node")
        if self.cpu_milli < 0:
            out.append(f"cpu_milli must not be negative, got {self.cpu_milli}")
        if self.host_memory_mb < 0:
            out.append(f"host_memory_mb must not be negative, got {self.host_memory_mb}")
        if self.topology_required and not self.topology_key:
            out.append("topology: a required topology needs a label key (e.g. rack)")
        return out


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """How a run is asked to stop: ``signal`` first, SIGKILL ``grace_s`` seconds later."""

    signal: str = "SIGTERM"
    grace_s: float = 30.0


@dataclass(frozen=True, slots=True)
class RunSpec:
    name: str
    project: str
    user: str
    command: tuple[str, ...]
    request: ResourceRequest = field(default_factory=ResourceRequest)
    priority: str = "normal"
    kind: RunKind = RunKind.TRAIN
    max_runtime_s: float | None = None
    preemptible: bool = True
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    experiment: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: _NO_ENV)
    workdir: str | None = None
    #: Pin the run to one backend by name (None = any backend that can host it).
    backend: str | None = None
    max_attempts: int | None = None
    #: Runs this one waits for (``model.jobs``); an array's elements, with ``%N`` as the limit.
    dependencies: tuple[Dependency, ...] = ()
    array_id: str | None = None
    array_index: int | None = None
    array_limit: int | None = None
    #: It may not start before this time (``--begin``).
    begin_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        out = self._base_dict(r)
        # job control keys only where set: older readers and golden files see the same dict
        if self.dependencies:
            out["dependencies"] = [d.to_text() for d in self.dependencies]
        if self.array_id is not None:
            out["array"] = {"id": self.array_id, "index": self.array_index,
                            "limit": self.array_limit}  # fmt: skip
        if self.begin_at is not None:
            out["begin_at"] = self.begin_at
        return out

    def _base_dict(self, r: ResourceRequest) -> dict[str, Any]:
        return {
            "name": self.name,
            "project": self.project,
            "user": self.user,
            "command": list(self.command),
            "request": {
                "gpus": r.gpus,
                "nodes": r.nodes,
                "gpu_types": list(r.gpu_types),
                "gpu_fraction": r.gpu_fraction,
                "gpu_memory_mb": r.gpu_memory_mb,
                "mig": r.mig,
                "topology_key": r.topology_key,
                "topology_required": r.topology_required,
                "cpu_milli": r.cpu_milli,
                "host_memory_mb": r.host_memory_mb,
            },
            "priority": self.priority,
            "kind": self.kind.value,
            "max_runtime_s": self.max_runtime_s,
            "preemptible": self.preemptible,
            "checkpoint": {"signal": self.checkpoint.signal, "grace_s": self.checkpoint.grace_s},
            "experiment": self.experiment,
            "env": dict(self.env),
            "workdir": self.workdir,
            "backend": self.backend,
            "max_attempts": self.max_attempts,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RunSpec:
        r = d.get("request", {})
        c = d.get("checkpoint", {})
        arr = d.get("array") or {}
        return RunSpec(
            name=d["name"],
            project=d["project"],
            user=d["user"],
            command=tuple(d["command"]),
            request=ResourceRequest(
                gpus=int(r.get("gpus", 1)),
                nodes=int(r.get("nodes", 1)),
                gpu_types=tuple(r.get("gpu_types", ())),
                gpu_fraction=r.get("gpu_fraction"),
                gpu_memory_mb=r.get("gpu_memory_mb"),
                mig=r.get("mig"),
                topology_key=r.get("topology_key"),
                topology_required=bool(r.get("topology_required", False)),
                cpu_milli=int(r.get("cpu_milli", 0)),
                host_memory_mb=int(r.get("host_memory_mb", 0)),
            ),
            priority=d.get("priority", "normal"),
            kind=RunKind(d.get("kind", "train")),
            max_runtime_s=d.get("max_runtime_s"),
            preemptible=bool(d.get("preemptible", True)),
            checkpoint=CheckpointPolicy(
                signal=c.get("signal", "SIGTERM"), grace_s=float(c.get("grace_s", 30.0))
            ),
            experiment=d.get("experiment"),
            env=MappingProxyType(dict(d.get("env", {}))),
            workdir=d.get("workdir"),
            backend=d.get("backend"),
            max_attempts=d.get("max_attempts"),
            dependencies=tuple(Dependency.from_text(x) for x in d.get("dependencies", ())),
            array_id=arr.get("id"),
            array_index=arr.get("index"),
            array_limit=arr.get("limit"),
            begin_at=d.get("begin_at"),
        )


@dataclass(frozen=True, slots=True)
class Run:
    """A run as the store records it."""

    id: str
    seq: int
    spec: RunSpec
    phase: Phase
    attempt: int
    submitted_at: float
    admitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    placement: Placement | None = None
    handle: str | None = None
    exit_code: int | None = None
    reason_code: str | None = None
    reason: str | None = None
    eta: float | None = None
    cancel_requested: bool = False
    preempt_requested: bool = False
    last_checkpoint_at: float | None = None
    #: GPU-seconds this run held over all its earlier attempts (least-attained-service order).
    attained_gpu_s: float = 0.0
    #: A requeued run waits until then (backoff).
    not_before: float | None = None
    #: When the current attempt joined the queue: the submit, or the requeue that made it.
    queued_at: float | None = None
    #: Held by a user (``hold``): it waits, in ``held``, until released.
    held: bool = False

    @property
    def queue_wait_s(self) -> float | None:
        """The current attempt's wait from joining the queue to admission."""
        if self.admitted_at is None:
            return None
        joined = self.queued_at if self.queued_at is not None else self.submitted_at
        return max(self.admitted_at - joined, 0.0)  # clocks of two processes may disagree

    @property
    def project(self) -> str:
        return self.spec.project

    @property
    def request(self) -> ResourceRequest:
        return self.spec.request
