"""What a user asks for when submitting a run, the same at every edge, and the one function
that turns it into a ``RunSpec``.

The CLI's flags (``cli.submit_cmd``), the SDK's keywords (``sdk.run.submit``) and the Prefect
worker's job variables (``mlops_gpu_prefect.worker``, through the SDK) each fill one
``SubmitRequest``; ``run_spec`` builds the spec from it in local mode, ``body`` the REST
body (``POST /runs``, ``server.schemas.SubmitBody``) in remote mode. So a field added to the
request is added once, and the edges cannot drift apart.

Invariants:
- ``signal`` is always a known signal's full name (``TERM`` becomes ``SIGTERM``); an unknown one
  is refused when the request is made (``SubmitFieldError`` naming the field), before anything
  is written or sent.
- ``run_spec`` is pure: the caller supplies the user, the config's default priority class and
  the working directory to use when the request names none (the edge's current one).
- ``body`` holds every field but ``command`` (a remote callable has none: the SDK sends its
  pickle instead) and leaves ``workdir`` as asked: None means the backend's folder on the
  server's side, never this host's.
"""

from __future__ import annotations

import os
import signal as signal_mod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mlops_gpu.model.run import CheckpointPolicy, ResourceRequest, RunSpec

#: The longest name a run gets from its command when it is given none.
NAME_FROM_COMMAND = 80


class SubmitFieldError(ValueError):
    """A submitted field that no run can have; ``field`` names it (each edge words it as its own
    flag, keyword or variable)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


def signal_name(name: str) -> str:
    """``name`` as a known signal's full name (``TERM``, ``sigterm`` -> ``SIGTERM``), else
    ``SubmitFieldError``."""
    full = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
    if not isinstance(getattr(signal_mod, full, None), signal_mod.Signals):
        raise SubmitFieldError("signal", f"unknown signal {name!r}")
    return full


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One submit as asked, before the config's defaults. Field names are the REST API's."""

    project: str
    command: tuple[str, ...] = ()
    name: str | None = None
    gpus: int = 1
    nodes: int = 1
    gpu_types: tuple[str, ...] = ()
    gpu_fraction: float | None = None
    gpu_memory_mb: int | None = None
    mig: str | None = None
    cpu_milli: int = 0
    host_memory_mb: int = 0
    topology_key: str | None = None
    topology_required: bool = False
    priority: str | None = None
    max_runtime_s: float | None = None
    experiment: str | None = None
    backend: str | None = None
    preemptible: bool = True
    signal: str = "SIGTERM"
    grace_s: float = 30.0
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        # (frozen: the normalized values are set the one way a frozen dataclass allows)
        object.__setattr__(self, "signal", signal_name(self.signal))
        object.__setattr__(self, "grace_s", float(self.grace_s))
        object.__setattr__(self, "env", dict(self.env))

    def resources(self) -> ResourceRequest:
        return ResourceRequest(
            gpus=self.gpus,
            nodes=self.nodes,
            gpu_types=self.gpu_types,
            gpu_fraction=self.gpu_fraction,
            gpu_memory_mb=self.gpu_memory_mb,
            mig=self.mig,
            topology_key=self.topology_key,
            topology_required=self.topology_required,
            cpu_milli=self.cpu_milli,
            host_memory_mb=self.host_memory_mb,
        )

    def body(self) -> dict[str, Any]:
        """The REST API's submit body, without ``command`` (the caller adds it, or a callable's
        payload)."""
        return {"project": self.project, "name": self.name, "gpus": self.gpus,
                "nodes": self.nodes, "gpu_types": list(self.gpu_types),
                "gpu_fraction": self.gpu_fraction, "gpu_memory_mb": self.gpu_memory_mb,
                "mig": self.mig, "cpu_milli": self.cpu_milli,
                "host_memory_mb": self.host_memory_mb, "topology_key": self.topology_key,
                "topology_required": self.topology_required, "priority": self.priority,
                "max_runtime_s": self.max_runtime_s, "experiment": self.experiment,
                "backend": self.backend, "preemptible": self.preemptible,
                "signal": self.signal, "grace_s": self.grace_s, "env": dict(self.env),
                "workdir": self.workdir, "max_attempts": self.max_attempts}  # fmt: skip


def run_spec(req: SubmitRequest, *, user: str, default_priority: str, cwd: str) -> RunSpec:
    """The spec every local edge queues for ``req``: its command as its name when it has none
    (cut to ``NAME_FROM_COMMAND``), the config's default class when it names none, and its
    working directory made absolute against ``cwd`` (the edge's own, when it names none)."""
    return RunSpec(
        name=req.name or " ".join(req.command)[:NAME_FROM_COMMAND],
        project=req.project,
        user=user,
        command=req.command,
        request=req.resources(),
        priority=req.priority or default_priority,
        max_runtime_s=req.max_runtime_s,
        preemptible=req.preemptible,
        checkpoint=CheckpointPolicy(req.signal, req.grace_s),
        experiment=req.experiment,
        env=dict(req.env),
        workdir=os.path.normpath(os.path.join(cwd, req.workdir or "")),
        backend=req.backend,
        max_attempts=req.max_attempts,
    )
