"""What an active run loaded from the store holds, as both engines book it.

A run a cycle placed holds exactly its placement. One loaded from the store
(``State.add_active`` without ``taken``, ``NativeEngine.add_active``) may name what the cluster
no longer has: a node was removed or renamed, or the config changed, while it ran (a k8s node
deleted, a Slurm node dropped from the config). Both engines book it as ``as_held`` leaves it,
so they decide alike (``tests/test_native_held.py``):
- a slot on a node the cluster has keeps the devices that node has (whole devices and MIG
  slices), each once: a device the node lacks, or named twice, holds nothing more (and the run
  is charged for the devices it keeps);
- a device or slice that another active run holds too (two runs loaded as ``n0:0,1`` and
  ``n0:1,2``) is held by both: it is free only when the last of them ends, so no new run is
  placed on a device someone still holds (both engines count its holders, ``Capacity.again``,
  as a snapshot booked at once does; ``as_held`` itself sees one run and changes nothing
  here); each run is charged for its own devices;
- its slots on the cluster's nodes hold the same host CPU and memory: where they differ (a
  placement no cycle makes), each holds the most any of them names;
- a slot on a node the cluster no longer has holds nothing on a node, and still counts in the
  run's quota until the run ends (``Capacity.take``);
- a run of a project the config no longer has holds its devices and host resources; its quota
  is booked under a project no run belongs to (the native engine: one extra project, with no
  quota and no cohort), so nobody reads it, and it is no victim (victims are sought among the
  preemptor's project and cohort);
- a run placed on a GPU type the cluster no longer has holds the devices of its slots on the
  cluster's nodes; its quota is booked under that type, which no run can ask for, and it is no
  victim candidate (victims are sought by the types a run can use): the native engine books it
  on any type, charged nothing and never a victim (``_engine.Held.charged`` 0);
- a backend the cluster no longer has changes nothing (nodes, not placements, carry backends).

Invariant: ``as_held(as_held(r, n), n) == as_held(r, n)``, and ``as_held`` returns ``run``
itself when it changes nothing (every placement a cycle makes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from mlops_gpu.model import Node, NodeSlot, Run


def as_held(run: Run, nodes: Mapping[str, Node]) -> Run:
    """``run`` as the engines book it (see the module docstring); ``nodes``: by name."""
    p = run.placement
    if p is None:
        raise ValueError(f"run {run.id} is active without a placement")
    on = [s for s in p.slots if s.node in nodes]
    cpu = max((s.cpu_milli for s in on), default=0)
    mem = max((s.host_memory_mb for s in on), default=0)
    slots: list[NodeSlot] = []
    changed = False
    for s in p.slots:
        node = nodes.get(s.node)
        if node is None:
            slots.append(s)
            continue
        has = set(node.devices).union(*node.mig.values())
        devices = tuple(dict.fromkeys(d for d in s.devices if d in has))
        if devices != s.devices or (s.cpu_milli, s.host_memory_mb) != (cpu, mem):
            changed = True
            s = replace(s, devices=devices, cpu_milli=cpu, host_memory_mb=mem)
        slots.append(s)
    if not changed:
        return run
    return replace(run, placement=replace(p, slots=tuple(slots)))
