"""``FromScratch``: the Python reference engine, the core driven by events (submit, finish,
checkpoint) that decides each cycle from a whole snapshot (``core.policy.decide``).

It is the tests' oracle, ``simulate --engine reference`` and the scheduler's engine where the
Rust one is not built (``controller.mirror``); the Rust engine (``engines.native.NativeEngine``)
has the same interface and makes the same decisions.

Invariants:
- Between cycles it keeps only the runs (``pending``, ``active``), the ends reported for the
  dependencies (``ended_phase``) and the anchor its last cycle kept (``Snapshot.anchor``);
  every cycle builds its ``State`` afresh from ``snapshot(now)``.
- ``active`` holds each run as ``held.as_held`` books it on the current nodes (as the native
  engine keeps it): what ``finish`` returns.
- It applies its own decisions: admissions become active runs, preemption victims are flagged
  (``preempt_requested``) and hold nothing from then on, so a caller (the simulator, the
  controller's mirror, a benchmark) only reports submissions, checkpoints and completions
  (a victim's completion is its exit).
Pure: the clock comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from mlops_gpu.core.decision import Decision, PendingReason
from mlops_gpu.core.held import as_held
from mlops_gpu.core.policy import decide, decide_keeping
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.core.state import holdings
from mlops_gpu.model import Node, Phase, Run

UsageHistory = Mapping[tuple[str, str], float]
Spent = Mapping[str, tuple[float, float]]


class FromScratch:
    def __init__(self, template: Snapshot) -> None:
        """``template`` gives nodes, projects, classes, cohorts, policy and capabilities (and
        the usage history and spending a cycle is not given)."""
        self.template = template
        self._nodes = {n.name: n for n in template.nodes}
        self.pending: dict[str, Run] = {}
        self.active: dict[str, Run] = {}
        self.anchor: str | None = template.anchor  # kept between cycles (``Snapshot.anchor``)
        self.ended_phase: dict[str, Phase | None] = {}  # ``Snapshot.ended``

    # -- events -------------------------------------------------------------------------
    def submit(self, run: Run) -> None:
        self.pending[run.id] = run

    def ended(self, run_id: str, phase: Phase | None) -> None:
        """``run_id`` ended in ``phase`` (None: unknown), for the dependencies on it."""
        self.ended_phase[run_id] = phase

    def remove_pending(self, run_id: str) -> Run:
        """A pending run leaves without running (cancelled, or changed in the store)."""
        return self.pending.pop(run_id)

    def add_active(self, run: Run) -> None:
        """A run that holds its placement already (loaded from the store), as ``as_held``
        books it."""
        self.active[run.id] = as_held(run, self._nodes)

    def finish(self, run_id: str) -> Run:
        return self.active.pop(run_id)

    def checkpoint(self, run_id: str, at: float) -> None:
        """An active run reported a checkpoint at ``at``."""
        if run_id in self.active:
            self.active[run_id] = replace(self.active[run_id], last_checkpoint_at=at)

    def set_nodes(self, nodes: tuple[Node, ...], now: float) -> None:
        """Capacity changed (nodes came, went, drained): the next cycles see these nodes, and
        the active runs are booked on them (``as_held``)."""
        self.template = replace(self.template, nodes=nodes)
        self._nodes = {n.name: n for n in nodes}
        self.active = {rid: as_held(r, self._nodes) for rid, r in self.active.items()}

    # -- what it holds ------------------------------------------------------------------
    def kept_anchor(self) -> str | None:
        """The run that keeps the reservation next cycle (``Snapshot.anchor``), or None."""
        return self.anchor if self.anchor in self.pending else None

    @property
    def used(self) -> Mapping[tuple[str, str], float]:
        """GPUs held per (project, GPU type) (``Capacity.used``)."""
        return holdings(self.snapshot(self.template.now)).used

    def snapshot(
        self,
        now: float,
        usage_history: UsageHistory | None = None,
        spent: Spent | None = None,
    ) -> Snapshot:
        """Everything held, as the snapshot a cycle at ``now`` decides on."""
        t = self.template
        return replace(
            t,
            now=now,
            pending=tuple(self.pending.values()),
            active=tuple(self.active.values()),
            usage_history=t.usage_history if usage_history is None else dict(usage_history),
            spent=t.spent if spent is None else dict(spent),
            anchor=self.kept_anchor(),
            ended=dict(self.ended_phase) if self.ended_phase else t.ended,
        )

    # -- cycles -------------------------------------------------------------------------
    def cycle(
        self, now: float, usage_history: UsageHistory | None = None, spent: Spent | None = None
    ) -> Decision:
        """One cycle (``policy.decide``), applied: admitted runs become active, victims are
        flagged. Without explanations (``Decision.pending`` is empty, as the native engine's
        cycle leaves it): ``explain_all`` gives them."""
        d, self.anchor = decide_keeping(self.snapshot(now, usage_history, spent), explain=False)
        self.apply(d, now)
        return d

    def explain_all(
        self, now: float, usage_history: UsageHistory | None = None, spent: Spent | None = None
    ) -> list[PendingReason]:
        """A reason and ETA for every pending run, from a cycle that is not applied."""
        return list(decide(self.snapshot(now, usage_history, spent)).pending)

    def apply(self, d: Decision, now: float) -> None:
        for a in d.admissions:
            run = self.pending.pop(a.run_id)
            self.active[run.id] = replace(
                run, phase=Phase.RUNNING, placement=a.placement, admitted_at=now, started_at=now
            )
        for p in d.preemptions:
            self.active[p.run_id] = replace(self.active[p.run_id], preempt_requested=True)
