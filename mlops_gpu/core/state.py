"""``State``: everything a scheduling cycle reads, kept up to date by events so that a cycle
does not rebuild it from a whole snapshot.

Invariants:
- ``State.from_snapshot(s)`` and a ``State`` that saw the same runs submitted, admitted,
  preempted and finished one event at a time are equal in every field a cycle reads; this is
  what lets the incremental engine make exactly the decisions of a from-scratch recomputation
  (the differential test checks it).
- Pending runs live in ``queues[project][shape]``: runs of one project with the same request,
  priority class, LAS level and preemptibility (only a preemptible run may borrow), sorted
  by ``order_key``: (LAS level, submit time, sequence), or under ``order: shortest``
  (max_runtime, sequence). Runs of one such queue are interchangeable for placement and
  quota, so a cycle can judge a queue by its head.
- A pending run with ``not_before`` in the future waits in ``backoff`` until ``now`` reaches it;
  a run with an unknown project or priority class waits in ``invalid``.
- ``running[(project, type)]`` holds the preemptible active runs not being preempted (the
  victim candidates), matching the counts in ``victims``; ``victim_ends[(project, type,
  class)]`` holds their expected ends (start + ``max_runtime``, infinite without one), sorted,
  so ``longest_to_go`` is one lookup. ``oldest`` holds one entry per queue for its oldest run,
  sorted (the reservation's anchor is chosen by age, ``anchor.anchor``).
- A run being preempted (``going``: its preemption decided, its job not yet exited) stays in
  ``active`` but holds nothing: no devices, no quota, no fair-share usage, no place in the
  timelines or the victim pools. Its devices are free, except where the preemptor admitted in
  the same decision took them (the controller, not the core, waits for it to exit).
- The keys a queue is filed by are ``queue_keys``'; the nodes' timelines of expected ends,
  with their own invariants, are ``timelines.Timelines``, which ``State`` extends.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
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
from mlops_gpu.model import Phase, Placement, Run


class State(Timelines):
    def __init__(self, template: Snapshot) -> None:
        """``template`` gives the cluster, projects, classes, cohorts, policy; its runs are
        ignored (use ``from_snapshot`` to load them)."""
        self.template = replace(template, pending=(), active=(), anchor=None)
        self.now = template.now
        self.cap = Capacity(self.template)
        self.quota = QuotaBook(self.template, self.cap.used)
        self.capacity_by_type = self.cap.capacity_by_type
        self.types = sorted({n.gpu_type for n in template.nodes})
        self.active: dict[str, Run] = {}
        self.going: set[str] = set()
        self.pending: dict[str, Run] = {}
        self.queues: dict[str, dict[ShapeKey, list[Run]]] = defaultdict(dict)
        self.backoff: list[tuple[float, int, str]] = []
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
        #: (project, shape key) -> the ages of its queue's runs, sorted; ``oldest`` one entry
        #: per queue for its oldest run, sorted (the anchor is chosen by age: ``anchor.anchor``)
        self.ages: dict[tuple[str, ShapeKey], list[Age]] = {}
        self.oldest: list[OldestEntry] = []
        self._oldest_of: dict[tuple[str, ShapeKey], OldestEntry] = {}
        #: the run that held the reservation after the last applied cycle (``Snapshot.anchor``)
        self.anchor: str | None = template.anchor
        super().__init__()  # the timelines (``Timelines``)
        self._types_of: dict[ShapeKey, list[str]] = {}
        self._accepted: dict[tuple[str, ...], list[str]] = {}

    @staticmethod
    def from_snapshot(snap: Snapshot) -> State:
        st = State(snap)
        for a in snap.active:
            st.add_active(a)
        for r in snap.pending:
            st.add_pending(r)
        return st

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

    # -- events -------------------------------------------------------------------------
    def add_pending(self, run: Run) -> None:
        t = self.template
        self.pending[run.id] = run
        if run.project not in t.projects or run.spec.priority not in t.priority_classes:
            what = "project" if run.project not in t.projects else "priority class"
            self.invalid[run.id] = f"unknown {what}"
        elif run.not_before is not None and run.not_before > self.now:
            heapq.heappush(self.backoff, (run.not_before, run.seq, run.id))
        else:
            self._enqueue(run)

    def _enqueue(self, run: Run) -> None:
        key = order_key(self.template, run)
        self.order_keys[run.id] = key
        sk = shape_key(self.template, run)
        subqueues = self.queues[run.project]
        q = subqueues.get(sk)
        if q is None:
            q = subqueues[sk] = []
        if not q or self.order_keys[q[-1].id] <= key:
            q.append(run)  # the common case: submitted after everything queued
        else:
            insort(q, run, key=lambda r: self.order_keys[r.id])
        self._age(run, sk, add=True)

    def remove_pending(self, run_id: str) -> Run:
        run = self.pending.pop(run_id)
        if self.invalid.pop(run_id, None) is not None:
            return run
        subqueues = self.queues.get(run.project, {})
        sk = shape_key(self.template, run)
        q = subqueues.get(sk)
        if q is not None:
            # by identity, from the head: admitted runs are nearly always at the front
            for i, queued in enumerate(q):
                if queued is run or queued.id == run_id:
                    del q[i]
                    break
            if not q:
                del subqueues[sk]
            if run_id in self.order_keys:
                self._age(run, sk, add=False)
        self.order_keys.pop(run_id, None)
        return run  # a run in backoff is skipped when it comes up (it is no longer pending)

    def _age(self, run: Run, sk: ShapeKey, add: bool) -> None:
        """Book (or unbook) a queued run's age, and re-file its queue's oldest run."""
        key = (run.project, sk)
        ages = self.ages.setdefault(key, [])
        age = age_of(run)
        if add:
            if not ages or ages[-1] < age:
                ages.append(age)
            else:
                insort(ages, age)
        else:
            i = bisect_left(ages, age)
            if i < len(ages) and ages[i] == age:
                del ages[i]
        old = self._oldest_of.pop(key, None)
        if old is not None:
            i = bisect_left(self.oldest, old)
            assert self.oldest[i] == old
            del self.oldest[i]
        if ages:
            entry = (-int(sk[0]), ages[0], run.project, sk)  # type: ignore[call-overload]
            insort(self.oldest, entry)
            self._oldest_of[key] = entry
        else:
            del self.ages[key]

    def add_active(self, run: Run, taken: bool = False) -> None:
        """A run now holds its placement (``taken``: the cycle booked it already; otherwise
        it is booked as ``held.as_held`` leaves it, which is what ``active`` then keeps)."""
        self._hold(run if taken else as_held(run, self.cap.nodes), taken)

    def _hold(self, run: Run, taken: bool) -> None:
        assert run.placement is not None, f"active run {run.id} has no placement"
        self.active[run.id] = run
        if run.preempt_requested:  # being preempted: it holds nothing (see the invariants)
            self.going.add(run.id)
            return
        if not taken:
            self.cap.take(run.project, run.placement, run.request.gpu_types)
        self.held[(run.project, run.placement.gpu_type)][run.id] = run
        self._timeline(run, add=True)
        if run.spec.preemptible:
            self._victim(run, +1)

    def _victim(self, run: Run, delta: int) -> None:
        assert run.placement is not None
        key = (run.project, run.placement.gpu_type)
        pool = self.victims[key]
        value = self.template.priority_of(run)
        pool[value] += delta
        if not pool[value]:
            del pool[value]
        mr = run.spec.max_runtime_s
        start = start_of(run)
        # without a start its end moves with the clock: infinite keeps longest_to_go an upper
        # bound, which is all its users need
        end = math.inf if mr is None or start is None else start + mr
        ends = self.victim_ends[(run.project, run.placement.gpu_type, value)]
        if delta > 0:
            self.running[key][run.id] = run
            insort(ends, end)
        else:
            self.running[key].pop(run.id, None)
            i = bisect_left(ends, end)
            if i < len(ends) and ends[i] == end:
                del ends[i]

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

    def admit(self, run_id: str, placement: Placement, now: float, taken: bool = False) -> Run:
        run = self.remove_pending(run_id)
        active = replace(
            run, phase=Phase.RUNNING, placement=placement, admitted_at=now, started_at=now
        )
        self._hold(active, taken)  # (a cycle's placement: as ``as_held`` leaves it)
        return active

    def mark_going(self, run_id: str, released: bool = False) -> None:
        """The run's preemption was decided: from now on it holds nothing (``released``: the
        cycle that chose it gave its devices and quota back already)."""
        run = self.active[run_id]
        if run.id in self.going:
            return
        self.going.add(run_id)
        self.active[run_id] = replace(run, preempt_requested=True)
        self._drop(run, released)

    def finish(self, run_id: str) -> Run:
        run = self.active.pop(run_id)
        if run_id in self.going:  # it held nothing since its preemption was decided
            self.going.discard(run_id)
            return run
        self._drop(run, False)
        return run

    def _drop(self, run: Run, released: bool) -> None:
        """An active run stops holding anything: devices, quota, timeline, victim pool."""
        assert run.placement is not None
        if not released:
            self.cap.release(run.project, run.placement, run.request.gpu_types)
        self.held[(run.project, run.placement.gpu_type)].pop(run.id, None)
        self._timeline(run, add=False)
        if run.spec.preemptible:
            self._victim(run, -1)

    def checkpoint(self, run_id: str, at: float) -> None:
        """An active run reported a checkpoint at ``at`` (``Run.last_checkpoint_at``): what
        a same-class preemption asks of a victim (``Cycle._ready``) and its lost work."""
        run = self.active.get(run_id)
        if run is None:
            return
        run = replace(run, last_checkpoint_at=at)
        self.active[run_id] = run
        assert run.placement is not None
        pool = self.running.get((run.project, run.placement.gpu_type))
        if pool is not None and run_id in pool:
            pool[run_id] = run

    def set_time(self, now: float) -> None:
        """Advance the clock; runs whose backoff is over join their queues."""
        self.now = now
        while self.backoff and self.backoff[0][0] <= now:
            _, _, rid = heapq.heappop(self.backoff)
            run = self.pending.get(rid)
            if run is not None and rid not in self.order_keys:
                self._enqueue(run)

    def snapshot(self, now: float) -> Snapshot:
        """The whole state as a snapshot (pending runs included): what ``decide`` would get."""
        anchor = self.anchor if self.anchor in self.pending else None
        return replace(self.view(now), pending=tuple(self.pending.values()), anchor=anchor)

    def in_backoff(self) -> list[Run]:
        return [
            self.pending[rid]
            for _, _, rid in sorted(self.backoff)
            if rid in self.pending and rid not in self.order_keys
        ]
