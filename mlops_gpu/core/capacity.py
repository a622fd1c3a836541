"""Free capacity and quota usage derived from a snapshot, updated as a cycle admits runs.

Invariant: ``free[node]`` is the node's devices minus every device named in an active run's
placement slot on that node, kept in the node's own device order; ``used[(project, type)]`` is
the sum of GPUs held by the project's active runs of that type.
"""

from __future__ import annotations

from collections import defaultdict

from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Node, Placement


class Capacity:
    def __init__(self, snap: Snapshot) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in snap.nodes}
        held: dict[str, set[str]] = defaultdict(set)
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        for run in snap.active:
            p = run.placement
            if p is None:
                continue
            for slot in p.slots:
                held[slot.node].update(slot.devices)
            self.used[(run.project, p.gpu_type)] += p.total_gpus
        self.free: dict[str, list[str]] = {
            n.name: [d for d in n.devices if d not in held[n.name]] for n in snap.nodes
        }

    def take(self, project: str, placement: Placement) -> None:
        for slot in placement.slots:
            taken = set(slot.devices)
            self.free[slot.node] = [d for d in self.free[slot.node] if d not in taken]
        self.used[(project, placement.gpu_type)] += placement.total_gpus

    def largest_free_block(self, gpu_type: str) -> int:
        return max(
            (
                len(self.free[n.name])
                for n in self.nodes.values()
                if n.gpu_type == gpu_type and n.schedulable
            ),
            default=0,
        )
