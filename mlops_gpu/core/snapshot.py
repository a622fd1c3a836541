"""The core's only input: an immutable picture of capacity, runs and policy at one instant.

Built by the controller (or the simulator) from the store, the backends' inventories and the
config. ``active`` runs hold GPUs through their placements; ``pending`` runs wait for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mlops_gpu.core.fragmentation import Shape
from mlops_gpu.model import (
    BackendCapabilities,
    Cohort,
    GpuType,
    Node,
    Phase,
    PolicySettings,
    Project,
    Run,
)

_EMPTY_COHORTS: Mapping[str, Cohort] = MappingProxyType({})
_NO_CAPS: Mapping[str, BackendCapabilities] = MappingProxyType({})
_DEFAULT_CAPS = BackendCapabilities()
_NO_USAGE: Mapping[tuple[str, str], float] = MappingProxyType({})
_NO_SPENT: Mapping[str, tuple[float, float]] = MappingProxyType({})
_NO_PRIOR: Mapping[Shape, float] = MappingProxyType({})
_NO_ENDED: Mapping[str, Phase | None] = MappingProxyType({})


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
    #: Decayed past GPU-seconds per (project, GPU type): finished attempts only (current
    #: allocations are in ``active``), each second weighted 2^(-age / half_life).
    usage_history: Mapping[tuple[str, str], float] = field(default_factory=lambda: _NO_USAGE)
    #: Spent in each budgeted project's current window: (GPU-hours, USD).
    spent: Mapping[str, tuple[float, float]] = field(default_factory=lambda: _NO_SPENT)
    #: The run that held the EASY reservation after the last cycle an engine applied, if it is
    #: still pending (the engines remember it; ``anchor.anchor``): it keeps the reservation
    #: while it fits now, so that no run the order prefers takes what it waited for.
    anchor: str | None = None
    #: Run shapes expected of the workload (``fragmentation.Shape`` -> how many runs), added
    #: to the active runs' shapes where fragmentation-aware placement weighs them (as FGD is
    #: given the workload's distribution of pod shapes). Empty: the active runs alone. The
    #: openb benchmark fills it with its pod file's shapes; the controller leaves it empty.
    shape_prior: Mapping[Shape, float] = field(default_factory=lambda: _NO_PRIOR)
    #: How the runs that pending runs depend on ended (``model.jobs``): run id -> its final
    #: phase, or None for an id the store does not know. A dependency that is neither here nor
    #: pending nor active is unknown too (``eligibility``).
    ended: Mapping[str, Phase | None] = field(default_factory=lambda: _NO_ENDED)

    def priority_of(self, run: Run) -> int:
        return self.priority_classes.get(run.spec.priority, 0)

    def caps(self, backend: str) -> BackendCapabilities:
        return self.capabilities.get(backend, _DEFAULT_CAPS)


__all__ = ["PolicySettings", "Snapshot"]
