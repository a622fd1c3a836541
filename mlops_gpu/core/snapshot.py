"""The core's only input: an immutable picture of capacity, runs and policy at one instant.

Built by the controller (or the simulator) from the store, the backends' inventories and the
config. ``active`` runs hold GPUs through their placements; ``pending`` runs wait for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mlops_gpu.model import BackendCapabilities, Cohort, GpuType, Node, Project, Run

_EMPTY_COHORTS: Mapping[str, Cohort] = MappingProxyType({})
_NO_CAPS: Mapping[str, BackendCapabilities] = MappingProxyType({})
_DEFAULT_CAPS = BackendCapabilities()


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Policy switches from the config's ``policy`` section."""

    name: str = "default"
    #: ``best-effort-fifo``: a blocked run does not block smaller runs behind it;
    #: ``strict-fifo``: within a project, nothing starts ahead of a blocked older run.
    queueing: str = "best-effort-fifo"


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[Node, ...]
    pending: tuple[Run, ...]
    active: tuple[Run, ...]
    projects: Mapping[str, Project]
    gpu_types: Mapping[str, GpuType]
    priority_classes: Mapping[str, int]
    cohorts: Mapping[str, Cohort] = field(default_factory=lambda: _EMPTY_COHORTS)
    policy: PolicySettings = field(default_factory=PolicySettings)
    #: Per backend name; a backend missing here has the default capabilities.
    capabilities: Mapping[str, BackendCapabilities] = field(default_factory=lambda: _NO_CAPS)

    def priority_of(self, run: Run) -> int:
        return self.priority_classes.get(run.spec.priority, 0)

    def caps(self, backend: str) -> BackendCapabilities:
        return self.capabilities.get(backend, _DEFAULT_CAPS)
