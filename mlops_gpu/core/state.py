"""``State``: everything a scheduling cycle reads, built once from a snapshot for one cycle.

Invariants:
- A ``State`` is built from one snapshot (``from_snapshot``) and serves one cycle; nothing
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
  victim candidates), matching the counts in ``victims``; ``victim_ends[(project, type,
  class)]`` holds their expected ends (start + ``max_runtime``, infinite without one), sorted,
  so ``longest_to_go`` is one lookup. ``ages[(project, shape)]`` holds the ages of a queue's
  runs, sorted, and ``oldest`` one entry per queue for its oldest run, sorted (the
  reservation's anchor is chosen by age, ``anchor.anchor``).
- A run being preempted (``going``: its preemption decided, its job not yet exited) stays in
  ``active`` but holds nothing: no devices, no quota, no fair-share usage, no place in the
  timelines or the victim pools.
- The keys a queue is filed by are ``queue_keys``'; the nodes' timelines of expected ends,
  with their own invariants, are ``timelines.Timelines``, which ``State`` extends.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from mlops_gpu.core.backfill import start_of
from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.held import as_held
from mlops_gpu.core.placement import could_ever_fit
from mlops_gpu.core.queue_keys import (
    Age,
    OldestEntry,
    ShapeKey,
    age_of,
    order_key,
    shape_key,
)
from mlops_gpu.core.quota import QuotaBook
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.core.timelines import Timelines
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


class State(Timelines):
    def __init__(self, snap: Snapshot) -> None:
        """The state of ``snap``: its active runs hold their placements, its pending runs are
        queued (or in backoff, or invalid)."""
        self.template = replace(snap, pending=(), active=(), anchor=None)
        self.now = snap.now
        self.cap = Capacity(self.template)
        self.quota = QuotaBook(self.template, self.cap.used)
        self.capacity_by_type = self.cap.capacity_by_type
        self.types = sorted({n.gpu_type for n in snap.nodes})
        self.active: dict[str, Run] = {}
        self.going: set[str] = set()
        self.pending: dict[str, Run] = {r.id: r for r in snap.pending}
        self.queues: dict[str, dict[ShapeKey, list[Run]]] = defaultdict(dict)
        self.backoff: list[Run] = []
        self.invalid: dict[str, str] = {}
        #: run id -> its place in its queue, for the queued runs (not in backoff or invalid)
        self.order_keys: dict[str, tuple[int, float, int]] = {}
        #: (project, GPU type) -> class value -> preemptible active runs not being preempted:
        #: who could be a victim, without scanning the active runs.
        self.victims: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self.running: dict[tuple[str, str], dict[str, Run]] = defaultdict(dict)
        #: (project, GPU type) -> its active runs not being preempted (the anchor's quota hold
        #: reads their ends: ``Cycle._quota_of``)
        self.held: dict[tuple[str, str], dict[str, Run]] = defaultdict(dict)
        self.victim_ends: dict[tuple[str, str, int], list[float]] = defaultdict(list)
        self.ages: dict[tuple[str, ShapeKey], list[Age]] = {}
        self.oldest: list[OldestEntry] = []
        #: the run the engine kept the reservation for after its last cycle (``Snapshot.anchor``)
        self.anchor: str | None = snap.anchor
        super().__init__()  # the timelines (``Timelines``)
        self._types_of: dict[ShapeKey, list[str]] = {}
        self._accepted: dict[tuple[str, ...], list[str]] = {}
        for a in snap.active:
            self._hold(as_held(a, self.cap.nodes))
        for r in snap.pending:
            self._file(r)
        self._sort()

    @staticmethod
    def from_snapshot(snap: Snapshot) -> State:
        return State(snap)

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
            self.ages.setdefault((run.project, sk), []).append(age_of(run))

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
        self._timeline(run)
        if run.spec.preemptible:
            value = self.template.priority_of(run)
            self.victims[key][value] += 1
            self.running[key][run.id] = run
            mr = run.spec.max_runtime_s
            start = start_of(run)
            # without a start its end moves with the clock: infinite keeps longest_to_go an
            # upper bound, which is all its users need
            end = math.inf if mr is None or start is None else start + mr
            self.victim_ends[(*key, value)].append(end)

    def _sort(self) -> None:
        """Once everything is filed: queues in their order (stable: the snapshot's order breaks
        no tie, ``order_key``'s seq does), ages, ends and timelines sorted."""
        keys = self.order_keys
        for subqueues in self.queues.values():
            for q in subqueues.values():
                q.sort(key=lambda r: keys[r.id])
        for (project, sk), ages in self.ages.items():
            ages.sort()
            self.oldest.append((-int(sk[0]), ages[0], project, sk))  # type: ignore[call-overload]
        self.oldest.sort()
        self.backoff.sort(key=lambda r: (r.not_before, r.seq, r.id))
        for ends in self.victim_ends.values():
            ends.sort()
        self._sort_timelines()

    # -- what a cycle asks ----------------------------------------------------------------
    def longest_to_go(self, project: str, gpu_type: str, class_value: int, now: float) -> float:
        """The most time any victim candidate of (project, type, class) is expected to run on
        (as ``backfill.expected_end`` counts it), infinite for one without ``max_runtime``;
        -1 when there is none."""
        end = self.latest_victim_end(project, gpu_type, class_value)
        return -1.0 if end is None else max(end - now, 0.0)

    def latest_victim_end(self, project: str, gpu_type: str, class_value: int) -> float | None:
        """The latest expected end of a victim candidate of (project, type, class), None when
        there is none (``longest_to_go`` before the clock)."""
        ends = self.victim_ends.get((project, gpu_type, class_value))
        return ends[-1] if ends else None

    def ever_fits(self, run: Run) -> list[str]:
        """The acceptable GPU types on which an empty cluster could host the run (cached: it
        depends only on the request and the nodes)."""
        key = ("ever", *shape_key(self.template, run))
        types = self._types_of.get(key)
        if types is None:
            types = [
                t
                for t in self.types_of(run)
                if could_ever_fit(self.template.nodes, self.template.capabilities, run, t)
            ]
            self._types_of[key] = types
        return types

    def types_of(self, run: Run) -> list[str]:
        """The cluster's GPU types the run accepts (cached by the request's type list)."""
        key = run.request.gpu_types
        types = self._accepted.get(key)
        if types is None:
            types = self._accepted[key] = [t for t in self.types if run.request.accepts(t)]
        return types

    def in_backoff(self) -> list[Run]:
        """The runs in backoff, in the order their backoff ends."""
        return list(self.backoff)
