"""A scheduling engine: the core driven by events (submit, finish) instead of whole snapshots.

``FromScratch`` rebuilds a ``Snapshot`` for every cycle and calls ``decide``: the reference.
Both apply their own decisions (admissions become active runs; preemption victims are flagged
and hold nothing from then on) so that a caller (the simulator, a benchmark) only reports
submissions, checkpoints and completions (a victim's completion is its exit).
Pure: the clock comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from mlops_gpu.core.cycle import Cycle
from mlops_gpu.core.decision import Decision, PendingReason
from mlops_gpu.core.policy import decide, decide_keeping
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.core.state import State
from mlops_gpu.model import Node, Phase, Run


class FromScratch:
    def __init__(self, template: Snapshot) -> None:
        """``template`` gives nodes, projects, classes, cohorts, policy and capabilities."""
        self.template = template
        self.pending: dict[str, Run] = {}
        self.active: dict[str, Run] = {}
        self.anchor: str | None = None  # kept between cycles (``Snapshot.anchor``)
        self.ended_phase: dict[str, Phase | None] = {}  # ``Snapshot.ended``

    def submit(self, run: Run) -> None:
        self.pending[run.id] = run

    def ended(self, run_id: str, phase: Phase | None) -> None:
        """``run_id`` ended in ``phase`` (None: unknown), for the dependencies on it."""
        self.ended_phase[run_id] = phase

    def remove_pending(self, run_id: str) -> Run:
        return self.pending.pop(run_id)

    def finish(self, run_id: str) -> Run:
        return self.active.pop(run_id)

    def kept_anchor(self) -> str | None:
        """The run that keeps the reservation next cycle (``Snapshot.anchor``), or None."""
        return self.anchor if self.anchor in self.pending else None

    def checkpoint(self, run_id: str, at: float) -> None:
        """An active run reported a checkpoint at ``at``."""
        if run_id in self.active:
            self.active[run_id] = replace(self.active[run_id], last_checkpoint_at=at)

    def snapshot(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
    ) -> Snapshot:
        return replace(
            self.template,
            now=now,
            pending=tuple(self.pending.values()),
            active=tuple(self.active.values()),
            usage_history=dict(usage_history or self.template.usage_history),
            anchor=self.anchor if self.anchor in self.pending else None,
            ended=dict(self.ended_phase) if self.ended_phase else self.template.ended,
        )

    def cycle(
        self, now: float, usage_history: Mapping[tuple[str, str], float] | None = None
    ) -> Decision:
        d, self.anchor = decide_keeping(self.snapshot(now, usage_history))
        self.apply(d, now)
        return d

    def explain_all(self, now: float) -> tuple[PendingReason, ...]:
        return decide(self.snapshot(now)).pending

    def apply(self, d: Decision, now: float) -> None:
        for a in d.admissions:
            run = self.pending.pop(a.run_id)
            self.active[run.id] = replace(
                run, phase=Phase.RUNNING, placement=a.placement, admitted_at=now, started_at=now
            )
        for p in d.preemptions:
            self.active[p.run_id] = replace(self.active[p.run_id], preempt_requested=True)


class Incremental:
    """The engine the scheduler keeps between cycles: a ``State`` updated by events, so a cycle
    does not rebuild it from a whole snapshot (it still judges every queue head). Decisions
    equal ``FromScratch``'s."""

    def __init__(self, template: Snapshot) -> None:
        self.template = template
        self.state = State(template)

    @property
    def pending(self) -> dict[str, Run]:
        return self.state.pending

    @property
    def active(self) -> dict[str, Run]:
        return self.state.active

    def submit(self, run: Run) -> None:
        self.state.add_pending(run)

    def finish(self, run_id: str) -> Run:
        return self.state.finish(run_id)

    def checkpoint(self, run_id: str, at: float) -> None:
        """An active run reported a checkpoint at ``at`` (``State.checkpoint``)."""
        self.state.checkpoint(run_id, at)

    def remove_pending(self, run_id: str) -> Run:
        """A pending run leaves without running (cancelled, or changed in the store)."""
        return self.state.remove_pending(run_id)

    def add_active(self, run: Run) -> None:
        """A run that holds its placement already (loaded from the store)."""
        self.state.add_active(run)

    def snapshot(self, now: float) -> Snapshot:
        return self.state.snapshot(now)

    def kept_anchor(self) -> str | None:
        """The run that keeps the reservation next cycle (``Snapshot.anchor``), or None."""
        anchor = self.state.anchor
        return anchor if anchor in self.state.pending else None

    @property
    def used(self) -> Mapping[tuple[str, str], float]:
        """GPUs held per (project, GPU type) (``Capacity.used``)."""
        return self.state.cap.used

    def set_nodes(self, nodes: tuple[Node, ...], now: float) -> None:
        """Capacity changed (nodes came, went, drained): rebuild the state around it."""
        snap = replace(self.state.snapshot(now), nodes=nodes)
        self.template = replace(self.template, nodes=nodes)
        self.state = State.from_snapshot(snap)

    def explain_all(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> list[PendingReason]:
        """A reason and ETA for every pending run, from a cycle that is not applied (right
        after a cycle it admits nothing; whatever it books is given back, and the victims it
        chose take back what they held)."""
        cycle = Cycle(self.state, now, usage_history, spent)
        d = cycle.run()
        reasons = cycle.explain()
        self._undo(d)
        return reasons

    def _undo(self, d: Decision) -> None:
        """Give back what an unapplied cycle booked: its admissions' placements, and its
        victims' holdings (taken back)."""
        cap = self.state.cap
        for a in d.admissions:
            run = self.state.pending[a.run_id]
            cap.release(run.project, a.placement, run.request.gpu_types)
        for p in d.preemptions:
            v = self.state.active[p.run_id]
            assert v.placement is not None
            cap.take(v.project, v.placement, v.request.gpu_types)

    def cycle(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> Decision:
        """One cycle; its decision is applied to the state (admitted runs become active,
        victims are flagged)."""
        c = Cycle(self.state, now, usage_history, spent)
        d = c.run()
        self.state.anchor = c.kept_anchor()
        for a in d.admissions:
            self.state.admit(a.run_id, a.placement, now, taken=True)
        for p in d.preemptions:
            self.state.mark_going(p.run_id, released=True)
        return d
