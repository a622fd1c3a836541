"""What the native engine (``core.native``) serves, and why it refuses the rest.

``unsupported`` (a snapshot) and ``held_unsupported`` (an active run as it is placed) give the
one-line reason, or None; ``NativeEngine`` raises ``NotSupported`` with it, and the control
loop's ``Mirror`` and the simulator then run the Python engine (nothing is guessed). The native
engine queues every pending run it is given; it serves:
- whole GPUs; with a topology (``topology_key``, required or preferred: nodes' labels cross
  as numbers, each key's values in name order); with host CPU and memory (runs' requests per
  node, nodes' capacities), under either ``policy.placement``: ``fragmentation`` (the default)
  places one-node runs by the growth of expected fragmentation and orders a run's GPU types by
  headroom and growth (``core/fragmentation.py``, ``type_choice``), as the Python core does to
  the last bit of its ``round()`` and ``sum()`` (runs' ``gpu_types`` cross as named:
  ``accepts``; compared on random clusters by ``tests/test_native_fragmentation.py``), with
  a ``Snapshot.shape_prior`` (the packing simulator's; as ``_engine.PriorShape``) whose
  counts are whole numbers and whose shapes' GPU types are sorted (as ``sim/packing`` makes
  them);
- MIG slices (``request.mig``; nodes' slices cross as ``_engine.PartSpec``, numbered after
  their whole devices, profiles numbered in name order) and parts of shared devices by
  fraction and/or memory (``gpu_fraction``, ``gpu_memory_mb``; as ``_engine.ShapeSpec``) under
  either placement (``fragmentation`` weighs a part by the growth of its node's expected
  fragmentation, ``after_share``; a shared node makes the cluster one to weigh, as host
  resources do: ``PartSpec.shared_node``); where fragmentation-aware placement weighs the
  cluster, MIG slices are placed best fit as elsewhere, book their host CPU and memory on
  the node (which its signature shows) and add no shape to the mix (``Capacity._host``), and
  a MIG run's GPU types are not reordered (``Cycle._try``), as in the Python core (compared
  by ``tests/test_native_fragmentation.py``, whose clusters have MIG nodes and runs);
  active runs holding slices or parts cross with each slot's share
  (``_engine.SlotShare``), and every slot of such a run must be on a node of the cluster;
- CPU-only runs (``gpus`` 0: host CPU and/or memory on one node of a type they accept, as
  ``_engine.ShapeSpec(cpu_only=True)``), placed by ``placement._place_cpu``'s rules (under
  ``fragmentation``: growth class and CPU balance first; then the most CPU per free GPU
  share left, then the name), charged no quota (amount 0, on the type placed; still held
  back where its project already holds more than ``QuotaBook.admits`` allows on every type),
  preempting and preempted as any run (they free host resources, they lose no GPU-seconds),
  never reserved for (backfill reserves for whole-GPU runs only); compared on random
  clusters by ``tests/test_native_core.py`` and ``tests/test_native_cpu.py``;
- every ``order`` (``shortest``, ``submit``, ``las``), with ``policy.shortest_preempt_borrowers``
  (``core/borrowers.py``; in Rust ``native/src/preempt/borrowers.rs``: each victim it takes
  crosses back with the two projects' shares for its message,
  ``_engine.Preempted.borrower_shares``), and project budgets: each cycle the projects whose
  budget is spent (``fairshare.budget_exceeded`` on the ``spent`` it is given) cross as
  ``_engine.BudgetSpent``: their runs wait (``action: wait``) or are served at the
  ``lower_to`` class (``action: lower``), as ``Cycle._level_of`` has it.

Invariant: everything not refused here is decided by the Rust engine exactly as by the Python
core (``tests/test_native_core.py`` and ``tests/test_native_fragmentation.py`` compare them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Run

if TYPE_CHECKING:
    from mlops_gpu.core.native import NativeEngine


class NotSupported(ValueError):
    """The native engine does not implement what the snapshot or run asks for."""


def unsupported(template: Snapshot) -> str | None:
    """Why the native engine cannot schedule for ``template``, or None when it can."""
    p = template.policy
    if p.order not in ("shortest", "submit", "las"):
        return f"policy.order {p.order!r} (the native engine orders by shortest, submit or las)"
    if not p.borrower_share_ratio >= 1:  # (the config refuses it; a Snapshot built in code may not)
        return f"policy.borrower_share_ratio {p.borrower_share_ratio!r} (the native engine: >= 1)"
    for (*_, accepts), count in template.shape_prior.items():
        # (whole counts: the engine's sums of counts are then exact in any order, as Python's
        # are in its dict's; sorted accepts: the order shapes compare in is the names')
        if not math.isfinite(count) or count < 0 or count >= 9e15 or count != int(count):
            return f"a shape prior count {count!r} (the native engine: whole numbers)"
        if list(accepts) != sorted(accepts):
            return f"a shape prior's GPU types {accepts!r} (the native engine: sorted)"
    return None


def held_unsupported(eng: NativeEngine, run: Run) -> str | None:
    """Why ``eng`` cannot load the active ``run`` as it is placed, or None when it can."""
    p = run.placement
    if p is None:
        return f"run {run.id} is active without a placement"
    if p.backend not in eng._backend_ix or p.gpu_type not in eng._type_ix:
        return f"run {run.id} is placed on backend {p.backend}, type {p.gpu_type}: not here"
    if run.project not in eng._project_ix:
        return f"run {run.id} holds GPUs for unknown project {run.project}"
    part = any(s.fraction != 1.0 or s.memory_mb is not None for s in p.slots)
    for s in p.slots:
        if len(set(s.devices)) != len(s.devices):
            return f"run {run.id} holds a device twice on node {s.node}"
        if part and s.node not in eng._node_ix:
            return (
                f"run {run.id} holds part of a GPU and GPUs on node {s.node}, which the "
                "cluster no longer has"
            )
        if (s.cpu_milli, s.host_memory_mb) != (
            run.request.cpu_milli,
            run.request.host_memory_mb,
        ):
            return f"run {run.id} holds host CPU or memory on node {s.node} it did not ask for"
        node = eng._node_ix.get(s.node)
        if node is not None and not set(s.devices) <= set(eng._dev_names[node]):
            return f"run {run.id} holds devices that node {s.node} does not have"
    return None
