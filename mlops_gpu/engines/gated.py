"""``Gated``: an engine (``NativeEngine``, or the reference ``FromScratch``) behind the job
control gate (``eligibility``), kept by events so that a cycle costs what changed.

The inner engine holds only the pending runs the gate passes; ``Gated`` keeps the others
aside and moves them in when they become eligible: a dependency ends (``ended``), the clock
reaches a begin time (the ``begins`` heap), an array element is admitted or finishes (the
array is re-filled up to its limit before the next cycle). Holding and releasing are a run
changed in the store: removed, then submitted again.

Invariant: before each cycle, the inner engine's pending runs are exactly
``eligibility.gate(snapshot).eligible``, so ``cycle`` decides what ``decide`` decides on the
snapshot (``tests/core/test_job_control.py`` checks it on random workloads), and the Rust
engine, which knows nothing of job control, stays equal to the Python one.

The caller reports how each run ended (``ended``, also for a pending run cancelled), and, for a
dependency that is neither pending nor active here, its final phase or None (unknown) before
it submits the run that depends on it; ``finish`` alone (a victim about to be requeued) is not
an end. An inner engine that judges dependencies itself (``FromScratch`` runs ``decide``, which
gates again: without the ends it would find a met dependency unknown) shares ``ended_phase``.

Bounded memory: with ``forget_ended`` set (the controller's mirror, whose store answers for
any other id before a dependent is submitted), ``ended_phase`` keeps, from one cycle to the
next, only the ends some pending run here names: an end is dropped when the last pending run
naming it leaves, and one that no pending run named by the next cycle is dropped then (the
mirror reports ends before it submits the runs that name them). Without it (the simulator, the
benchmark: no store to ask) every end is kept, since a run submitted later may name any.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from mlops_gpu.core import eligibility as el
from mlops_gpu.core.decision import Decision, PendingReason, ReasonCode
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Phase, Run


class Engine(Protocol):
    pending: Any
    active: Any

    def submit(self, run: Run) -> None: ...
    def finish(self, run_id: str) -> Run: ...
    def checkpoint(self, run_id: str, at: float) -> None: ...
    def snapshot(self, now: float) -> Snapshot: ...
    def kept_anchor(self) -> str | None: ...


def _nowhere(rid: object) -> bool:
    return False


class _Live:
    """The ids a dependency may wait on: pending here, or active in the inner engine."""

    def __init__(self, g: Gated) -> None:
        self.g = g

    def __contains__(self, rid: object) -> bool:
        g = self.g
        return rid in g.pending or rid in g.inner.active or g.live_elsewhere(rid)

    def __len__(self) -> int:  # pragma: no cover - Collection's protocol
        return len(self.g.pending) + len(self.g.inner.active)

    def __iter__(self) -> Any:  # pragma: no cover
        yield from self.g.pending
        yield from self.g.inner.active


class Gated:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pending: dict[str, Run] = {}  # every pending run, in the inner engine or not
        self.ended_phase: dict[str, Phase | None] = {}
        #: Drop an end once no pending run here names it (see the module docstring).
        self.forget_ended = False
        #: dependency id -> how many pending runs here name it (what ``ended_phase`` keeps)
        self._named: dict[str, int] = defaultdict(int)
        self._unnamed: set[str] = set()  # ends recorded that no pending run named then
        if isinstance(getattr(inner, "ended_phase", None), dict):
            # The inner engine judges dependencies itself (``FromScratch``: ``decide`` gates
            # again): it reads this record of ends, which ``forget_ended`` keeps bounded.
            inner.ended_phase = self.ended_phase
        self._live = _Live(self)
        #: Whether a run this engine does not hold is live (the controller's runs admitted
        #: without a placement); a dependency on one waits.
        self.live_elsewhere: Callable[[object], bool] = _nowhere
        self._now: float = getattr(getattr(inner, "template", None), "now", 0.0)
        #: dependency id -> pending runs that wait for it
        self._dependents: dict[str, set[str]] = defaultdict(set)
        self._begins: list[tuple[float, int, str]] = []
        self._waiting: dict[str, PendingReason] = {}  # reasons of runs held back by 1-4
        self._doomed: dict[str, PendingReason] = {}
        #: per array id: its elements that passed 1-4, sorted by (seq, id); those of them in
        #: the inner engine; its active elements; the limit
        self._ready: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self._queued: dict[str, set[str]] = defaultdict(set)
        self._running: dict[str, int] = defaultdict(int)
        self._limit: dict[str, int] = {}
        self._dirty: set[str] = set()

    @property
    def active(self) -> Any:
        return self.inner.active

    # -- events -------------------------------------------------------------------------
    def submit(self, run: Run) -> None:
        self.pending[run.id] = run
        for rid in {d.run_id for d in run.spec.dependencies}:
            self._named[rid] += 1
        if not el.controlled(run):
            self.inner.submit(run)
        else:
            self._stage(run)

    def _stage(self, run: Run) -> None:
        """Judge a pending run not in the inner engine (steps 1-4), and file it."""
        reason, never = el.before_array(run, self._now, self._live, self.ended_phase)
        # judged again when a dependency still to end does: a waiting (or held) run's doom
        # shows at once, and a doomed run's may move to one earlier in its list, which is the
        # one ``decide`` names (an eligible run has none still to end)
        for d in run.spec.dependencies:
            if d.run_id not in self.ended_phase:
                self._dependents[d.run_id].add(run.id)
        if never:
            assert reason is not None
            self._doomed[run.id] = reason
            return
        if reason is not None:
            self._waiting[run.id] = reason
            if reason.reason_code is ReasonCode.BEGIN_TIME:
                heapq.heappush(self._begins, (reason.eta or 0.0, run.seq, run.id))
            return
        self._waiting.pop(run.id, None)
        aid = run.spec.array_id
        if run.spec.array_limit is None or aid is None:
            self.inner.submit(run)
            return
        self._limit[aid] = run.spec.array_limit
        insort(self._ready[aid], (run.seq, run.id))
        self._dirty.add(aid)

    def _unstage(self, run: Run) -> None:
        rid = run.id
        self._waiting.pop(rid, None)
        self._doomed.pop(rid, None)
        aid = run.spec.array_id
        if aid is not None and aid in self._ready:
            ready = self._ready[aid]
            i = bisect_left(ready, (run.seq, rid))
            if i < len(ready) and ready[i][1] == rid:
                del ready[i]
                self._dirty.add(aid)
            self._queued[aid].discard(rid)

    def _left(self, run: Run) -> None:
        """``run`` is no longer pending here: the ends only it named may go."""
        for rid in {d.run_id for d in run.spec.dependencies}:
            n = self._named[rid] - 1
            if n > 0:
                self._named[rid] = n
                continue
            del self._named[rid]
            if self.forget_ended:
                self.ended_phase.pop(rid, None)

    def remove_pending(self, run_id: str) -> Run:
        run = self.pending.pop(run_id)
        self._left(run)
        if run_id in self.inner.pending:
            self.inner.remove_pending(run_id)
        self._unstage(run)
        return run  # (its entries in ``_dependents`` and ``_begins`` are skipped later)

    def add_active(self, run: Run) -> None:
        self.inner.add_active(run)
        if run.spec.array_id is not None:
            self._running[run.spec.array_id] += 1

    def finish(self, run_id: str) -> Run:
        run: Run = self.inner.finish(run_id)
        aid = run.spec.array_id
        if aid is not None:
            self._running[aid] -= 1
            self._dirty.add(aid)
        return run

    def ended(self, run_id: str, phase: Phase | None) -> None:
        """``run_id`` ended in ``phase`` (None: no such run): its dependents are judged again."""
        self.ended_many([(run_id, phase)])

    def ended_many(self, items: Iterable[tuple[str, Phase | None]]) -> None:
        """``ended`` for several runs: all are recorded before any dependent is judged (one
        that waits for two of them must not find the second gone and not yet ended)."""
        items = list(items)
        for run_id, phase in items:
            self.ended_phase[run_id] = phase
            if self.forget_ended and run_id not in self._named:
                self._unnamed.add(run_id)
        again: set[str] = set()
        for run_id, _ in items:
            again.update(self._dependents.pop(run_id, ()))
        for rid in sorted(again):
            run = self.pending.get(rid)
            # (a doomed run too: ``decide`` names the first dependency in its list that can
            # never be met, which may be one that ended after the one that doomed it)
            if run is not None and rid not in self.inner.pending:
                self._restage(run)

    def _restage(self, run: Run) -> None:
        self._unstage(run)
        self._stage(run)

    def checkpoint(self, run_id: str, at: float) -> None:
        self.inner.checkpoint(run_id, at)

    # -- cycles -------------------------------------------------------------------------
    def _prepare(self, now: float) -> None:
        """Move in what became eligible by ``now`` (begin times, array room)."""
        self._now = now
        for rid in self._unnamed:  # (``forget_ended``) still named by nobody: the store has it
            if rid not in self._named:
                self.ended_phase.pop(rid, None)
        self._unnamed.clear()
        while self._begins and self._begins[0][0] <= now:
            _, _, rid = heapq.heappop(self._begins)
            run = self.pending.get(rid)
            if run is not None and rid in self._waiting:
                self._restage(run)
        for aid in sorted(self._dirty):
            ready, queued = self._ready.get(aid, []), self._queued[aid]
            room = max(self._limit.get(aid, 0) - self._running.get(aid, 0), 0)
            want = [rid for _, rid in ready[:room]]
            keep = set(want)
            for rid in [q for q in queued if q not in keep]:
                self.inner.remove_pending(rid)
                queued.discard(rid)
            for rid in want:
                if rid not in queued:
                    self.inner.submit(self.pending[rid])
                    queued.add(rid)
        self._dirty.clear()

    def cycle(self, now: float, *args: Any) -> Decision:
        self._prepare(now)
        d: Decision = self.inner.cycle(now, *args)
        for a in d.admissions:
            run = self.pending.pop(a.run_id)
            self._left(run)
            aid = run.spec.array_id
            if aid is not None:
                self._running[aid] += 1
                if run.id in self._queued[aid]:
                    self._unstage(run)
        if not self._doomed:
            return d
        doomed = sorted(self._doomed.values(), key=lambda p: self.pending[p.run_id].seq)
        return replace(d, doomed=tuple(doomed))

    def explain_all(self, now: float, *args: Any) -> list[PendingReason]:
        self._prepare(now)
        out: list[PendingReason] = list(self.inner.explain_all(now, *args))
        out.extend(self._waiting.values())
        out.extend(self._doomed.values())
        for aid, ready in self._ready.items():
            queued = self._queued[aid]
            for _, rid in ready:
                if rid not in queued:
                    out.append(el.array_reason(self.pending[rid], self._limit[aid]))
        return out

    def snapshot(self, now: float) -> Snapshot:
        snap: Snapshot = self.inner.snapshot(now)
        return replace(snap, pending=tuple(self.pending.values()), ended=dict(self.ended_phase))

    def kept_anchor(self) -> str | None:
        anchor: str | None = self.inner.kept_anchor()
        return anchor

    @property
    def used(self) -> Mapping[tuple[str, str], float]:
        used: Mapping[tuple[str, str], float] = self.inner.used
        return used
