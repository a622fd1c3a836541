"""Free capacity and quota usage derived from a snapshot, updated as a cycle admits runs.

Invariants:
- ``free[node]`` lists the node's whole devices that no active run holds in any share, in the
  node's own order; ``shared[node][device]`` is the (fraction, memory MB) held on a device that
  shared runs use; ``mig_free[node][profile]`` lists free MIG slices.
- ``used[(project, gpu_type)]`` is the GPU amount (``Placement.gpu_amount``) held by the
  project's active runs of that type: their amounts counted in whole ``UNIT``s of a GPU and
  summed as integers (``units``), so it depends only on which runs hold what, never on the
  order they came and went in. (Summed as floats, shares and slices such as 1/7 leave a last
  bit that differs between an engine that booked and gave back for hours and a snapshot
  booked at once, and fair share breaks ties on the exact value: issue 25.)
- ``take`` and ``release`` are exact inverses, so a trial (preemption search) can undo itself.
- A device or MIG slice is free only when no active run holds it: ``again[(node, device)]``
  counts the holders beyond the first (only runs loaded from a store name a device another
  run holds, ``core/held.py``), and giving one back while others hold it frees nothing, as a
  snapshot booked at once (``decide``) has it. A shared device counts as one holder however
  many shared runs hold parts of it (their fractions are summed in ``shared``).
- ``shared[node][device]``'s fraction is ``share_units[(node, device)]`` over ``UNIT``: the
  shares summed as integers (each rounded to 1/``UNIT``, as ``used`` counts), so it depends
  only on who holds the device, never on the order they came and went in (a float sum of
  0.1, 0.4 and 0.2 less 0.4 is 0.29999999999999993, of 0.1 and 0.2 0.30000000000000004, and
  best fit compares what is left exactly).
- ``cpu_free[node]`` / ``mem_free[node]``: host CPU and memory not held by active runs (None
  where the node does not track them); ``mix`` counts the shapes of the slots held on GPUs.
- No index or cache: what placement asks of the nodes (who has k devices free, the largest
  free block) is read from ``free`` when asked. Speed is the Rust engine's job.
"""

from __future__ import annotations

from bisect import insort
from collections import defaultdict

from mlops_gpu.core.fragmentation import Mix, Shape, Sig
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Node, NodeSlot, Placement, ResourceRequest
from mlops_gpu.model.cluster import mig_share

#: Parts of a GPU that ``used`` counts in: a multiple of 7 (MIG slices are sevenths), of 2^16
#: and 3^2 x 5^6 (fractions and memory shares of usual GPU sizes), so those amounts are whole
#: units and their sums are exact; any other amount is rounded to 1/UNIT (1.6e-11 of a GPU),
#: far below the quota checks' tolerance (1e-9). The native engine uses the same.
UNIT = 2**16 * 3**2 * 5**6 * 7


class Capacity:
    def __init__(self, snap: Snapshot) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in snap.nodes}
        #: The nodes of each GPU type, in ``nodes``' order (placement looks at one type).
        self.of_type: dict[str, list[Node]] = defaultdict(list)
        for n in snap.nodes:
            self.of_type[n.gpu_type].append(n)
        self.used: dict[tuple[str, str], float] = defaultdict(float)
        #: GPU amount held per type, all projects together (``free_by_type``).
        self.type_used: dict[str, float] = defaultdict(float)
        #: ``used`` and ``type_used`` in ``UNIT``s: what they are worked out from.
        self.units: dict[tuple[str, str], int] = defaultdict(int)
        self.type_units: dict[str, int] = defaultdict(int)
        self.free: dict[str, list[str]] = {n.name: list(n.devices) for n in snap.nodes}
        self.shared: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
        self.share_units: dict[tuple[str, str], int] = {}
        #: (node, device or slice) -> how many active runs hold it beyond the first.
        self.again: dict[tuple[str, str], int] = {}
        self.mig_free: dict[str, dict[str, list[str]]] = {
            n.name: {p: list(ids) for p, ids in n.mig.items()} for n in snap.nodes
        }
        self.cpu_free: dict[str, int | None] = {n.name: n.cpu_milli for n in snap.nodes}
        self.mem_free: dict[str, int | None] = {n.name: n.host_memory_mb for n in snap.nodes}
        #: Whether fragmentation-aware placement has anything to weigh: shared devices, or
        #: host resources that can strand GPUs.
        self.fragmentable = any(
            n.shared or n.cpu_milli is not None or n.host_memory_mb is not None for n in snap.nodes
        )
        self.mix = Mix(snap.shape_prior)
        #: GPU amount per type (a MIG slice counts its share of a GPU): fixed with the nodes.
        by_type: dict[str, float] = defaultdict(float)
        for n in self.nodes.values():
            by_type[n.gpu_type] += n.capacity + sum(
                (len(ids) * mig_share(p) for p, ids in n.mig.items()), 0.0
            )
        self.capacity_by_type = dict(by_type)
        for run in snap.active:
            if run.placement is not None:
                self.take(run.project, run.placement, run.request.gpu_types)

    def free_by_type(self, gpu_type: str) -> float:
        """GPU amount of ``gpu_type`` no active run holds (cordoned nodes included: this is a
        measure of the type's supply, not a promise of placement)."""
        return self.capacity_by_type.get(gpu_type, 0.0) - self.type_used[gpu_type]

    def take(self, project: str, placement: Placement, accepts: tuple[str, ...] = ()) -> None:
        """Book ``placement``; ``accepts``: the GPU types its run accepted (for ``mix``)."""
        for slot in placement.slots:
            if slot.node not in self.nodes:
                continue  # a node that left the inventory: nothing to book
            node = self.nodes[slot.node]
            self._host(slot, -1, accepts)
            if not node.mig and slot.fraction >= 1.0 and slot.memory_mb is None:
                self._take_devices(node, slot.devices)
                continue
            for dev in slot.devices:
                mig_profile = _mig_profile_of(node, dev)
                if mig_profile is not None:
                    free = self.mig_free[slot.node][mig_profile]
                    if dev in free:
                        free.remove(dev)
                    else:  # held by another run already (one loaded from a store)
                        self._hold_again(slot.node, dev)
                elif slot.fraction >= 1.0 and slot.memory_mb is None:
                    self._take_devices(node, (dev,))
                else:
                    had = self.shared[slot.node].get(dev)
                    mem = had[1] if had else 0
                    key = (slot.node, dev)
                    held = self.share_units.get(key, 0) + round(slot.fraction * UNIT)
                    self.share_units[key] = held
                    self.shared[slot.node][dev] = (held / UNIT, mem + (slot.memory_mb or 0))
                    if had is None:  # (the device's first shared holder holds it)
                        self._take_devices(node, (dev,))
        self._book(project, placement.gpu_type, round(placement.gpu_amount * UNIT))

    def release(self, project: str, placement: Placement, accepts: tuple[str, ...] = ()) -> None:
        """Give back what ``take`` booked (with the same ``accepts``)."""
        for slot in placement.slots:
            if slot.node not in self.nodes:
                continue
            node = self.nodes[slot.node]
            self._host(slot, +1, accepts)
            if not node.mig and slot.fraction >= 1.0 and slot.memory_mb is None:
                self._free_devices(node, slot.devices)
                continue
            for dev in slot.devices:
                mig_profile = _mig_profile_of(node, dev)
                if mig_profile is not None:
                    if self.again and self._release_again(slot.node, dev):
                        continue
                    self.mig_free[slot.node][mig_profile].append(dev)
                    order = node.mig[mig_profile]
                    self.mig_free[slot.node][mig_profile].sort(key=order.index)
                elif slot.fraction >= 1.0 and slot.memory_mb is None:
                    self._free_devices(node, (dev,))
                else:
                    key = (slot.node, dev)
                    held = self.share_units[key] - round(slot.fraction * UNIT)
                    frac, mem = held / UNIT, self.shared[slot.node][dev][1] - (slot.memory_mb or 0)
                    if frac <= 1e-9 and mem <= 0:
                        del self.shared[slot.node][dev]
                        del self.share_units[key]
                        self._free_devices(node, (dev,))
                    else:
                        self.share_units[key] = held
                        self.shared[slot.node][dev] = (frac, mem)
        self._book(project, placement.gpu_type, -round(placement.gpu_amount * UNIT))

    def _book(self, project: str, gpu_type: str, units: int) -> None:
        """Add ``units`` to the project's and the type's holdings (``used``, ``type_used``)."""
        key = (project, gpu_type)
        held = self.units[key] + units
        self.units[key] = held
        self.used[key] = held / UNIT
        total = self.type_units[gpu_type] + units
        self.type_units[gpu_type] = total
        self.type_used[gpu_type] = total / UNIT

    def _host(self, slot: NodeSlot, sign: int, accepts: tuple[str, ...]) -> None:
        """Book (``sign`` -1) or give back (+1) a slot's host resources and mix shape."""
        if not self.fragmentable:
            return  # no host resources tracked, no shared devices: nothing here is read
        name = slot.node
        cpu, mem = self.cpu_free[name], self.mem_free[name]
        if cpu is not None:
            self.cpu_free[name] = cpu + sign * slot.cpu_milli
        if mem is not None:
            self.mem_free[name] = mem + sign * slot.host_memory_mb
        if slot.devices and _mig_profile_of(self.nodes[name], slot.devices[0]) is None:
            shape = slot_shape(slot, accepts)
            if sign < 0:
                self.mix.add(shape)
            else:
                self.mix.remove(shape)

    def host_fits(self, name: str, req: ResourceRequest) -> bool:
        if not req.cpu_milli and not req.host_memory_mb:
            return True
        cpu, mem = self.cpu_free[name], self.mem_free[name]
        return (cpu is None or req.cpu_milli <= cpu) and (mem is None or req.host_memory_mb <= mem)

    def signature(self, name: str) -> Sig:
        """The node's state as fragmentation sees it (``fragmentation.Sig``)."""
        shares = [1.0] * len(self.free[name])
        shares += [round(1.0 - f, 6) for f, _ in self.shared.get(name, {}).values()]
        free = tuple(sorted((x for x in shares if x > 1e-9), reverse=True))
        return (free, self.cpu_free[name], self.mem_free[name], self.nodes[name].gpu_type)

    def _take_devices(self, node: Node, devices: tuple[str, ...]) -> None:
        """Take the devices that are free."""
        free = self.free[node.name]
        for dev in devices:
            if dev in free:
                free.remove(dev)
            else:  # held by another run already (one loaded from a store)
                self._hold_again(node.name, dev)

    def _free_devices(self, node: Node, devices: tuple[str, ...]) -> None:
        """Give back the devices that are taken, in the node's device order."""
        free = self.free[node.name]
        for dev in devices:
            if self.again and self._release_again(node.name, dev):
                continue
            if dev not in free:
                insort(free, dev, key=node.devices.index)

    def _hold_again(self, node: str, dev: str) -> None:
        key = (node, dev)
        self.again[key] = self.again.get(key, 0) + 1

    def _release_again(self, node: str, dev: str) -> bool:
        """One of several holders of ``dev`` gives it back: True (it stays held) when others
        still hold it."""
        key = (node, dev)
        n = self.again.get(key)
        if not n:
            return False
        if n == 1:
            del self.again[key]
        else:
            self.again[key] = n - 1
        return True

    def largest_free_block(self, gpu_type: str) -> int:
        """The most free whole devices on one schedulable node of ``gpu_type``."""
        nodes = self.of_type.get(gpu_type, ())
        return max((len(self.free[n.name]) for n in nodes if n.schedulable), default=0)


def slot_shape(slot: NodeSlot, accepts: tuple[str, ...] = ()) -> Shape:
    shape = (len(slot.devices), round(slot.fraction, 6), slot.cpu_milli, slot.host_memory_mb)
    return (*shape, tuple(sorted(accepts)))


def _mig_profile_of(node: Node, dev: str) -> str | None:
    if not node.mig:
        return None
    for profile, ids in node.mig.items():
        if dev in ids:
            return profile
    return None
