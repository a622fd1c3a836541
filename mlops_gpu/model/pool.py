"""Elastic capacity: node pools (nodes of one shape that can be powered up and down) and the
power state of each of their nodes.

Invariants:
- A pool's nodes all offer ``gpus_per_node`` GPUs of ``gpu_type`` on ``backend``; at most
  ``max_nodes`` of them exist, and the scaler keeps at least ``min_nodes`` up or booting.
- A node is ``up`` (schedulable), ``booting`` (ready at ``ready_at``), ``powered_down`` (costs
  nothing, available after ``boot_s``) or ``draining`` (takes no new runs; powered down once
  empty). A node costs ``price_per_node_hour`` from the moment it starts booting until it is
  powered down, as cloud instances are billed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class NodeState(str, Enum):
    UP = "up"
    BOOTING = "booting"
    POWERED_DOWN = "powered_down"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    backend: str
    gpu_type: str
    gpus_per_node: int
    min_nodes: int
    max_nodes: int
    #: Seconds from asking for a node until it takes runs.
    boot_s: float
    price_per_node_hour: float
    #: An up node with no run and no reservation for this long is powered down.
    idle_s: float

    def node_cost(self, seconds: float) -> float:
        """USD for one node held ``seconds`` (booting included)."""
        return self.price_per_node_hour * seconds / 3600.0


@dataclass(frozen=True, slots=True)
class PoolNode:
    """One node of a pool as the scaler sees it."""

    name: str
    pool: str
    state: NodeState
    #: ``booting``: when it will take runs.
    ready_at: float | None = None
    #: ``up`` with nothing on it: since when (None while it holds a run).
    idle_since: float | None = None
