"""``State``: everything a scheduling cycle reads, built once from a snapshot for one cycle.

Invariants:
- A ``State`` is built from one snapshot (``State(snap)``) and serves one cycle; nothing
  keeps it up to date between cycles (the engine builds the next one from the next snapshot).
  What the cycle itself changes while it runs (its admissions take devices and quota, its
  victims give theirs back) goes through ``cap`` and ``quota``, changed in place; every other
  field is as built.
- Pending runs live in ``queues[project][shape]``: runs of one project with the same request,
  priority class, LAS level and preemptibility (only a preemptible run may borrow), sorted
  by ``order_key``: (LAS level, submit time, sequence), or under ``order: shortest``
  (max_runtime, sequence). Runs of one such queue are interchangeable for placement and
  quota, so a cycle can judge a queue by its head.
- A pending run with ``not_before`` after the snapshot's ``now`` waits in ``backoff`` (sorted
  by the end of its backoff); a run with an unknown project or priority class waits in
  ``invalid``.
- ``running[(project, type)]`` holds the preemptible active runs not being preempted (the
  victim candidates); ``held[(project, type)]`` all the active runs not being preempted.
- A run being preempted (``going``: its preemption decided, its job not yet exited) stays in
  ``active`` but holds nothing: no devices, no quota, no fair-share usage, no place in the
  victim pools.
- No index, cache or memo: what a cycle asks beyond these (the nodes' timelines, the queues'
  oldest runs, the types a run could use) is worked out from them when asked. Speed is the
  Rust engine's job; this is the reference. The keys a queue is filed by are ``queue_keys``'.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from mlops_gpu.core.backfill import start_of
from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.held import as_held
from mlops_gpu.core.placement import empty_cluster, place
from mlops_gpu.core.queue_keys import ShapeKey, order_key, shape_key
from mlops_gpu.core.quota import QuotaBook
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Run


def holdings(snap: Snapshot) -> Capacity:
    """The cluster's devices and quota usage with ``snap``'s active runs booked (each as
    ``held.as_held`` leaves it; a run being preempted holds nothing)."""
    cap = Capacity(replace(snap, pending=(), active=(), anchor=None))
    for run in snap.active:
        if not run.preempt_requested:
            held = as_held(run, cap.nodes)
            assert held.placement is not None, f"active run {run.id} has no placement"
            cap.take(held.project, held.placement, held.request.gpu_types)
    return cap


class State:
    def __init__(self, snap: Snapshot) -> None:
        """The state of ``snap``: its active runs hold their placements, its pending runs are
        queued (or in backoff, or invalid)."""
        self.template = replace(snap, pending=(), active=(), anchor=None)
        self.now = snap.now
        self.cap = Capacity(self.template)
        self.quota = QuotaBook(self.template, self.cap.used)
        self.capacity_by_type = self.cap.capacity_by_type
        self.types = sorted({n.gpu_type for n in snap.nodes})
        #: the cluster empty, every node schedulable: what a run could ever fit (``ever_fits``)
        self.empty = empty_cluster(snap.nodes, snap.capabilities)
        self.active: dict[str, Run] = {}
        self.going: set[str] = set()
        self.pending: dict[str, Run] = {r.id: r for r in snap.pending}
        self.queues: dict[str, dict[ShapeKey, list[Run]]] = defaultdict(dict)
        self.backoff: list[Run] = []
        self.invalid: dict[str, str] = {}
        #: run id -> its place in its queue, for the queued runs (not in backoff or invalid)
        self.order_keys: dict[str, tuple[int, float, int]] = {}
        #: (project, GPU type) -> preemptible active runs not being preempted: who could be a
        #: victim
        self.running: dict[tuple[str, str], dict[str, Run]] = defaultdict(dict)
        #: (project, GPU type) -> its active runs not being preempted (the anchor's quota hold
        #: reads their ends: ``cycle_reserve._quota_of``)
        self.held: dict[tuple[str, str], dict[str, Run]] = defaultdict(dict)
        #: the run the engine kept the reservation for after its last cycle (``Snapshot.anchor``)
        self.anchor: str | None = snap.anchor
        for a in snap.active:
            self._hold(as_held(a, self.cap.nodes))
        for r in snap.pending:
            self._file(r)
        self._sort()

    def view(
        self,
        now: float,
        usage_history: object = None,
        spent: object = None,
        with_active: bool = True,
    ) -> Snapshot:
        """A snapshot of the state for the helpers (placement, preemption, backfill): the
        active runs in the state (none without ``with_active``: a cycle reads them from the
        state, and only its explanations need them in a snapshot), no pending runs (the cycle
        reads those from ``queues``)."""
        t = self.template
        return replace(
            t,
            now=now,
            active=tuple(self.active.values()) if with_active else (),
            usage_history=t.usage_history if usage_history is None else usage_history,  # type: ignore[arg-type]
            spent=t.spent if spent is None else spent,  # type: ignore[arg-type]
        )

    # -- building -----------------------------------------------------------------------
    def _file(self, run: Run) -> None:
        """A pending run goes to ``invalid``, ``backoff`` or its queue (sorted by ``_sort``)."""
        t = self.template
        if run.project not in t.projects or run.spec.priority not in t.priority_classes:
            what = "project" if run.project not in t.projects else "priority class"
            self.invalid[run.id] = f"unknown {what}"
        elif run.not_before is not None and run.not_before > self.now:
            self.backoff.append(run)
        else:
            self.order_keys[run.id] = order_key(t, run)
            sk = shape_key(t, run)
            self.queues[run.project].setdefault(sk, []).append(run)

    def _hold(self, run: Run) -> None:
        """An active run holds its placement (as ``held.as_held`` left it)."""
        assert run.placement is not None, f"active run {run.id} has no placement"
        self.active[run.id] = run
        if run.preempt_requested:  # being preempted: it holds nothing (see the invariants)
            self.going.add(run.id)
            return
        self.cap.take(run.project, run.placement, run.request.gpu_types)
        key = (run.project, run.placement.gpu_type)
        self.held[key][run.id] = run
        if run.spec.preemptible:
            self.running[key][run.id] = run

    def _sort(self) -> None:
        """Once everything is filed: queues in their order (stable: the snapshot's order breaks
        no tie, ``order_key``'s seq does), backoff by its end."""
        keys = self.order_keys
        for subqueues in self.queues.values():
            for q in subqueues.values():
                q.sort(key=lambda r: keys[r.id])
        self.backoff.sort(key=lambda r: (r.not_before, r.seq, r.id))

    # -- what a cycle asks ----------------------------------------------------------------
    def longest_to_go(self, project: str, gpu_type: str, class_value: int, now: float) -> float:
        """The most time any victim candidate of (project, type, class) is expected to run on
        (start + ``max_runtime``), infinite for one without ``max_runtime`` or start (its end
        moves with the clock: infinite keeps it an upper bound, all its users need); -1 when
        there is none."""
        t = self.template
        ends = [
            math.inf
            if v.spec.max_runtime_s is None or start_of(v) is None
            else start_of(v) + v.spec.max_runtime_s  # type: ignore[operator]
            for v in self.running.get((project, gpu_type), {}).values()
            if t.priority_of(v) == class_value
        ]
        return max(max(ends) - now, 0.0) if ends else -1.0

    def victim_classes(self, project: str, gpu_type: str) -> set[int]:
        """The class values of the project's victim candidates on ``gpu_type``."""
        t = self.template
        return {t.priority_of(v) for v in self.running.get((project, gpu_type), {}).values()}

    def ever_fits(self, run: Run) -> list[str]:
        """The acceptable GPU types on which an empty cluster could host the run."""
        return [g for g in self.types_of(run) if place(*self.empty, run, g) is not None]

    def types_of(self, run: Run) -> list[str]:
        """The cluster's GPU types the run accepts."""
        return [t for t in self.types if run.request.accepts(t)]
