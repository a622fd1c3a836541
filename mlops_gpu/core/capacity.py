"""Free capacity and quota usage derived from a snapshot, updated as a cycle admits runs.

Invariants:
- ``free[node]`` lists the node's whole devices that no active run holds in any share, in the
  node's own order; ``shared[node][device]`` is the (fraction, memory MB) held on a device that
  shared runs use; ``mig_free[node][profile]`` lists free MIG slices.
- ``used[(project, gpu_type)]`` is the GPU amount (``Placement.gpu_amount``) held by the
  project's active runs of that type.
- ``take`` and ``release`` are exact inverses, so a trial (preemption search) can undo itself.
- ``buckets[(gpu_type, backend)][k]`` lists, sorted by name, the schedulable nodes with exactly
  ``k`` free whole devices: best fit is the first name of the first non-empty bucket >= need.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict

from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Node, Placement
from mlops_gpu.model.cluster import mig_share


class Capacity:
    def __init__(self, snap: Snapshot) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in snap.nodes}
        self.used: dict[tuple[str, str], float] = defaultdict(float)
        self.free: dict[str, list[str]] = {n.name: list(n.devices) for n in snap.nodes}
        self.shared: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
        self.mig_free: dict[str, dict[str, list[str]]] = {
            n.name: {p: list(ids) for p, ids in n.mig.items()} for n in snap.nodes
        }
        self.buckets: dict[tuple[str, str], list[list[str]]] = {}
        for n in sorted(snap.nodes, key=lambda n: n.name):
            if n.schedulable:
                b = self.buckets.setdefault((n.gpu_type, n.backend), [])
                while len(b) <= n.capacity:
                    b.append([])
                b[n.capacity].append(n.name)
        for run in snap.active:
            if run.placement is not None:
                self.take(run.project, run.placement)

    @property
    def capacity_by_type(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for n in self.nodes.values():
            out[n.gpu_type] += n.capacity + sum(len(ids) * mig_share(p) for p, ids in n.mig.items())
        return out

    def take(self, project: str, placement: Placement) -> None:
        for slot in placement.slots:
            if slot.node not in self.nodes:
                continue  # a node that left the inventory: nothing to book
            node = self.nodes[slot.node]
            for dev in slot.devices:
                mig_profile = _mig_profile_of(node, dev)
                if mig_profile is not None:
                    free = self.mig_free[slot.node][mig_profile]
                    if dev in free:
                        free.remove(dev)
                elif slot.fraction >= 1.0 and slot.memory_mb is None:
                    self._take_device(node, dev)
                else:
                    frac, mem = self.shared[slot.node].get(dev, (0.0, 0))
                    self.shared[slot.node][dev] = (
                        frac + slot.fraction,
                        mem + (slot.memory_mb or 0),
                    )
                    self._take_device(node, dev)
        self.used[(project, placement.gpu_type)] += placement.gpu_amount

    def release(self, project: str, placement: Placement) -> None:
        for slot in placement.slots:
            if slot.node not in self.nodes:
                continue
            node = self.nodes[slot.node]
            for dev in slot.devices:
                mig_profile = _mig_profile_of(node, dev)
                if mig_profile is not None:
                    self.mig_free[slot.node][mig_profile].append(dev)
                    order = node.mig[mig_profile]
                    self.mig_free[slot.node][mig_profile].sort(key=order.index)
                elif slot.fraction >= 1.0 and slot.memory_mb is None:
                    self._free_device(node, dev)
                else:
                    frac, mem = self.shared[slot.node][dev]
                    frac, mem = frac - slot.fraction, mem - (slot.memory_mb or 0)
                    if frac <= 1e-9 and mem <= 0:
                        del self.shared[slot.node][dev]
                        self._free_device(node, dev)
                    else:
                        self.shared[slot.node][dev] = (frac, mem)
        self.used[(project, placement.gpu_type)] -= placement.gpu_amount

    def _take_device(self, node: Node, dev: str) -> None:
        free = self.free[node.name]
        if dev in free:
            self._rebucket(node, len(free), len(free) - 1)
            free.remove(dev)

    def _free_device(self, node: Node, dev: str) -> None:
        free = self.free[node.name]
        if dev not in free:
            self._rebucket(node, len(free), len(free) + 1)
            free.append(dev)
            free.sort(key=node.devices.index)

    def _rebucket(self, node: Node, old: int, new: int) -> None:
        b = self.buckets.get((node.gpu_type, node.backend))
        if b is None or not node.schedulable:
            return
        names = b[old]
        del names[bisect_left(names, node.name)]
        insort(b[new], node.name)

    def free_amount(self, node: str) -> int:
        return len(self.free[node])

    def largest_free_block(self, gpu_type: str) -> int:
        return max(
            (
                len(self.free[n.name])
                for n in self.nodes.values()
                if n.gpu_type == gpu_type and n.schedulable
            ),
            default=0,
        )


def _mig_profile_of(node: Node, dev: str) -> str | None:
    if not node.mig:
        return None
    for profile, ids in node.mig.items():
        if dev in ids:
            return profile
    return None
