"""``NativeEngine.set_nodes``: capacity changed (nodes booted, powered down, drained), so the
Rust engine is rebuilt around the new nodes, as ``Incremental.set_nodes`` rebuilds its state.

Invariant: after ``set_nodes(engine, nodes, now)`` the engine holds the same active runs (with
their placements, loaded first and in sequence order, as ``controller.mirror`` reloads an
engine), the same pending runs (queued again, or back in backoff until their ``not_before``)
and the same kept anchor (the run that keeps the reservation next cycle), so that its next
cycle decides as ``Incremental``'s does after its own ``set_nodes``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from mlops_gpu.model import Node

if TYPE_CHECKING:
    from mlops_gpu.core.native import NativeEngine


def set_nodes(engine: NativeEngine, nodes: tuple[Node, ...], now: float) -> None:
    """Rebuild ``engine`` around ``nodes`` at ``now`` (the module docstring)."""
    anchor, active, pending = engine.kept_anchor(), engine.active, engine.pending
    # (a fresh extension and name indices: node numbers follow the new nodes' names)
    type(engine).__init__(engine, replace(engine.template, nodes=nodes, now=now))
    for run in sorted(active.values(), key=lambda r: r.seq):
        engine.add_active(run)
    for run in sorted(pending.values(), key=lambda r: r.seq):
        engine.submit(run)
    engine._engine.set_anchor(anchor)
