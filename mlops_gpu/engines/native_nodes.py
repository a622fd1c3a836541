"""The native engine's nodes: ``part_specs`` (the nodes with MIG slices or shared devices, as
the extension takes them) and ``NativeEngine.set_nodes`` (capacity changed: nodes booted,
powered down or drained), which rebuilds the Rust engine around the new nodes (the reference,
``FromScratch.set_nodes``, builds its next snapshot on them).

Invariant: after ``set_nodes(engine, nodes, now)`` the engine holds the same active runs (with
their placements, loaded first, in the engine's own order), the same pending runs (queued
again, or back in backoff until their ``not_before``) and the same kept anchor (the run that
keeps the reservation next cycle), so that its next cycle decides as ``FromScratch``'s does
after its own ``set_nodes``; a run it cannot load leaves the engine as it was.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING

from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Node

if TYPE_CHECKING:
    import mlops_gpu._engine as _engine
    from mlops_gpu.engines.native import NativeEngine


def set_nodes(engine: NativeEngine, nodes: tuple[Node, ...], now: float) -> None:
    """Rebuild ``engine`` around ``nodes`` at ``now`` (the module docstring)."""
    # (a fresh extension and name indices: node numbers follow the new nodes' names; built
    # aside and swapped in only once loaded, so a run it cannot load leaves ``engine`` whole)
    fresh = type(engine)(replace(engine.template, nodes=nodes, now=now))
    # in the engine's own order (admission, submission), as ``FromScratch`` builds each cycle's
    # state from its snapshot: the order holdings of shared devices are summed in
    for run in engine.active.values():
        fresh.add_active(run)
    for run in engine.pending.values():
        fresh.submit(run)
    fresh._engine.set_anchor(engine.kept_anchor())
    engine.__dict__.update(fresh.__dict__)


def part_specs(engine: NativeEngine, template: Snapshot, e: ModuleType) -> list[_engine.PartSpec]:
    """The nodes with MIG slices or shared devices, as the extension (``e``)'s
    ``PartSpec``s (called only where it is installed: ``NativeEngine`` refuses to start
    without it)."""
    out = []
    for i, n in enumerate(engine._nodes):
        if not n.mig and not n.shared:
            continue
        caps = template.caps(n.backend)
        by_name = sorted(range(n.capacity), key=n.devices.__getitem__)
        rank = [0] * n.capacity
        for k, d in enumerate(by_name):
            rank[d] = k
        mig = [
            e.MigSpec(profile=engine._profile_ix[p], slices=len(ids)) for p, ids in n.mig.items()
        ]
        out.append(
            e.PartSpec(
                node=i,
                mig=mig,
                mig_placeable=caps.mig,
                shared=n.shared and caps.shared_gpus,
                shared_node=n.shared,
                gpu_memory_mb=n.gpu_memory_mb,
                name_rank=rank,
            )
        )
    return out
