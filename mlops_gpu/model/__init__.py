"""Plain typed data shared by every layer: resources, run specs and records, phases, projects,
quotas, nodes and placements.

Invariants:
- This package imports nothing else of ``mlops_gpu`` (it is the bottom layer) and nothing heavy.
- Every type here is an immutable value (frozen dataclass or enum); layers above build new values
  instead of mutating, so a snapshot handed to the core can never change under it.
- Times are float seconds since the Unix epoch (UTC); durations are float seconds.
"""

from mlops_gpu.model.cluster import BackendCapabilities, GpuType, Node, NodeSlot, Placement
from mlops_gpu.model.jobs import DEPENDENCY_KINDS, Dependency
from mlops_gpu.model.phase import ACTIVE_PHASES, TERMINAL_PHASES, Phase
from mlops_gpu.model.policy import PolicySettings
from mlops_gpu.model.pool import NodeState, Pool, PoolNode
from mlops_gpu.model.project import Budget, Cohort, Project, Quota
from mlops_gpu.model.run import (
    CheckpointPolicy,
    ResourceRequest,
    Run,
    RunKind,
    RunSpec,
)

__all__ = [
    "ACTIVE_PHASES",
    "DEPENDENCY_KINDS",
    "TERMINAL_PHASES",
    "BackendCapabilities",
    "Budget",
    "CheckpointPolicy",
    "Cohort",
    "Dependency",
    "GpuType",
    "Node",
    "NodeSlot",
    "NodeState",
    "Phase",
    "Placement",
    "PolicySettings",
    "Pool",
    "PoolNode",
    "Project",
    "Quota",
    "ResourceRequest",
    "Run",
    "RunKind",
    "RunSpec",
]
