"""The keys a ``State`` files pending runs by: which queue (``shape_key``), the place in it
(``order_key``) and a run's age (``age_of``).

Invariants:
- Runs with the same ``shape_key`` (project aside: the queues are per project) are
  interchangeable for placement and quota: the same request (GPUs, nodes, types, fraction,
  memory, MIG profile, topology, host CPU and memory), priority class, LAS level, pinned
  backend and preemptibility (only a preemptible run may borrow). A cycle judges such a queue
  by its head.
- ``order_key`` sorts a project's queue: (LAS level, submit time, seq), or under
  ``order: shortest`` (0, max_runtime, seq) with no max_runtime as infinitely long; seq breaks
  every tie, so the order is total.
- ``age_of`` is (submit time, seq, run id): the smallest has waited longest, whatever the order.
"""

from __future__ import annotations

import math

from mlops_gpu.core.fairshare import las_level
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Run

ShapeKey = tuple[object, ...]
#: A run's age: (submit time, seq, run id); the smallest has waited longest
Age = tuple[float, int, str]


def age_of(run: Run) -> Age:
    return (run.submitted_at, run.seq, run.id)


def shape_key(snap: Snapshot, run: Run) -> ShapeKey:
    r = run.request
    level = las_level(snap, run.attained_gpu_s) if snap.policy.order == "las" else 0
    return (
        snap.priority_of(run),
        level,
        r.gpus,
        r.nodes,
        r.gpu_types,
        r.gpu_fraction,
        r.gpu_memory_mb,
        r.mig,
        r.topology_key,
        r.topology_required,
        # host CPU and memory: runs asking for different amounts are not interchangeable (one
        # asking for less may fit where the head does not); the Rust engine's key has them too
        r.cpu_milli,
        r.host_memory_mb,
        run.spec.backend,
        run.spec.preemptible,
    )


def order_key(snap: Snapshot, run: Run) -> tuple[int, float, int]:
    """A run's place in its project's queue: (LAS level, submit time, seq), or under
    ``shortest`` (0, max_runtime, seq) with no max_runtime as infinitely long."""
    if snap.policy.order == "shortest":
        mr = run.spec.max_runtime_s
        return (0, math.inf if mr is None else mr, run.seq)
    level = las_level(snap, run.attained_gpu_s) if snap.policy.order == "las" else 0
    return (level, run.submitted_at, run.seq)
