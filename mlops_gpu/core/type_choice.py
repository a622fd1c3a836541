"""Which GPU type comes first for a run that accepts several, under fragmentation-aware
placement.

Rules (in order):
- a type with no placement for the run comes last;
- when GPU-holding runs restricted to some of the candidate types are active, the type with the
  most *headroom* comes first: its free GPUs less the GPUs restricted runs hold on it (a run
  that accepts k types counts 1/k on each). The restricted load seen so far stands for as much
  again to come, so a run that could go anywhere leaves a scarce type to the runs that can use
  nothing else (on the openb GPU-model-constrained pods, fragmentation growth alone spent the
  scarce models on unconstrained pods: see benchmarks/RESULTS.md). Headroom is compared in
  steps of ``HEADROOM_STEP`` GPUs, so types within one 8-GPU node of each other tie;
- a CPU-only run holds no GPU: headroom does not apply to it;
- then the least growth of expected fragmentation (``placement.fragment_growth``: its class,
  CPU balance, node name);
- then the order the run listed its types in.

Invariants: the order depends only on the capacity state (``Capacity.free_by_type`` and the
mix of active runs' shapes), never on the order runs were admitted, so the Rust engine (its
state kept between cycles) and the reference order types alike. With no restricted runs active
the headroom rule is off, and the order is fragmentation growth alone.
"""

from __future__ import annotations

from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.placement import fragment_growth
from mlops_gpu.model import Placement

#: GPUs of headroom that make a difference between types (one 8-GPU node).
HEADROOM_STEP = 8.0

TypeKey = tuple[int, int, tuple[float, float, str], int]


def order_types(
    cap: Capacity, types: list[str], placed: dict[str, Placement | None], holds_gpus: bool = True
) -> list[str]:
    """``types`` best first for a run whose placement on each type is ``placed[type]``
    (``holds_gpus`` False: a CPU-only run)."""
    restricted = cap.mix.restricted()
    use_headroom = holds_gpus and any(restricted.get(t, 0.0) > 0.0 for t in types)

    def key(t: str) -> TypeKey:
        placement = placed[t]
        index = types.index(t)
        if placement is None:
            return (1, 0, (0.0, 0.0, ""), index)
        step = 0
        if use_headroom:
            headroom = cap.free_by_type(t) - restricted.get(t, 0.0)
            step = -round(headroom / HEADROOM_STEP)
        return (0, step, fragment_growth(cap, placement), index)

    return sorted(types, key=key)
