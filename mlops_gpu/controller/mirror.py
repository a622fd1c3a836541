"""``Mirror``: the controller's copy of the live runs and the engine kept in step with the store
through its change feed, so that reading the store costs what changed, not the queue's length.

- ``refresh`` reads the runs changed since the last revision seen (``Store.changed_since``) and
  moves each in the engine: out of wherever it was (pending or active), in where the store now
  has it (pending; active with a placement; nowhere once terminal). The first refresh, and any
  after ``reset``, loads every live run (``Store.live_runs``) into a fresh engine.
- ``cycle`` runs one cycle of the native engine (``engines.native``, the policy in Rust) wherever
  it is installed: it takes every config and every live run (one placed on a node, type or
  project the config no longer has is booked as ``core.held.as_held`` says, by either
  engine). Where the Rust engine is not installed (no cargo at install), the Python reference
  (``engines.reference.FromScratch``: ``decide`` on a snapshot per cycle, the same decisions, much
  slower) decides, and the first engine built logs ``native.PYTHON_ENGINE_WARNING`` once per
  process. The engine
  applies its own decision; the store writes that follow come back through the feed and replace
  the engine's copies, so a write that did not happen (an admission refused because the run was
  cancelled meanwhile) is undone by the cancel's own change.
- The node inventory, the config's projects and policy are compared each tick; a change
  rebuilds the engine around the same runs.

Job control (holds, begin times, dependencies, array limits) sits in front of either engine
(``engines.gated.Gated``): the mirror tells it how each run ended, and, for a dependency on a run
that ended before the scheduler saw it, reads its final phase from the store.

Invariant: after ``refresh``, ``runs`` holds exactly the store's non-terminal runs as of the
revision read, and the engine holds the same runs in the same phases.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from mlops_gpu.core.decision import Decision, PendingReason
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.engines import native
from mlops_gpu.engines.gated import Gated
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import ACTIVE_PHASES, TERMINAL_PHASES, Phase, Run
from mlops_gpu.state import Store
from mlops_gpu.state.jobs import final_phases

log = logging.getLogger("mlops_gpu.controller")
_warned = False  # PYTHON_ENGINE_WARNING was logged (once per process: it is about the install)


def _warn_python_engine() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("%s", native.PYTHON_ENGINE_WARNING)


class Mirror:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.runs: dict[str, Run] = {}
        self.rev: int | None = None
        #: the engine behind the job control gate (``engine``: the engine itself)
        self.gate: Gated | None = None
        self._template: Snapshot | None = None

    @property
    def engine(self) -> FromScratch | native.NativeEngine | None:
        """The engine the gate feeds (native or Python)."""
        return self.gate.inner if self.gate is not None else None

    def reset(self) -> None:
        """Forget everything: the next refresh reloads the live runs from the store."""
        self.rev, self.gate, self._template, self.runs = None, None, None, {}

    def refresh(self, template: Snapshot) -> None:
        """Catch up with the store; ``template`` (no runs) gives nodes, projects and policy."""
        if self.rev is None:
            live, self.rev = self.store.live_runs()
            self.runs = {r.id: r for r in live}
            self._rebuild(template)
            return
        changed, self.rev = self.store.changed_since(self.rev)
        if self._differs(template):
            for run in changed:
                self._note(run)
            self._rebuild(template)
            return
        for run in changed:
            self._forget(run.id)
            self._note(run)
        gated = self.gate
        assert gated is not None
        # before the runs that depend on them are judged
        gated.ended_many((r.id, r.phase) for r in changed if r.phase in TERMINAL_PHASES)
        self._resolve(changed)
        for run in sorted(changed, key=_seq):  # a dependency before its dependents
            if run.phase not in TERMINAL_PHASES:
                _load(gated, run)

    def pending(self) -> list[Run]:
        return sorted((r for r in self.runs.values() if r.phase is Phase.PENDING), key=_seq)

    def active(self) -> list[Run]:
        return sorted((r for r in self.runs.values() if r.phase in ACTIVE_PHASES), key=_seq)

    def kept_anchor(self) -> str | None:
        """The run the engine keeps the reservation for next cycle (``Snapshot.anchor``)."""
        return self.gate.kept_anchor() if self.gate is not None else None

    def cycle(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float],
        spent: Mapping[str, tuple[float, float]],
    ) -> Decision:
        assert self.gate is not None, "refresh first"
        return self.gate.cycle(now, usage_history, spent)

    def explain(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float],
        spent: Mapping[str, tuple[float, float]],
    ) -> list[PendingReason]:
        assert self.gate is not None, "refresh first"
        return self.gate.explain_all(now, usage_history, spent)

    # -- keeping the engine in step ----------------------------------------------------
    def _note(self, run: Run) -> None:
        if run.phase in TERMINAL_PHASES:
            self.runs.pop(run.id, None)
        else:
            self.runs[run.id] = run

    def _forget(self, run_id: str) -> None:
        engine = self.gate
        assert engine is not None
        if run_id in engine.pending:
            engine.remove_pending(run_id)
        elif run_id in engine.active:
            engine.finish(run_id)

    def _resolve(self, runs: list[Run]) -> None:
        """Tell the engine how the dependencies of ``runs`` that are not live ended."""
        engine = self.gate
        assert engine is not None
        missing = sorted(
            {
                d.run_id
                for r in runs
                if r.phase is Phase.PENDING
                for d in r.spec.dependencies
                if d.run_id not in self.runs and d.run_id not in engine.ended_phase
            }
        )
        engine.ended_many(final_phases(self.store, missing).items())

    def _differs(self, template: Snapshot) -> bool:
        t = self._template
        return t is None or _static(t) != _static(template)

    def _rebuild(self, template: Snapshot) -> None:
        self._template = template
        held = [
            r for r in self.runs.values() if r.phase in ACTIVE_PHASES and r.placement is not None
        ]
        waiting = [r for r in self.runs.values() if r.phase is Phase.PENDING]
        runs = sorted(held, key=_seq) + sorted(waiting, key=_seq)
        module = native.installed()
        if module is None:
            _warn_python_engine()
        inner = FromScratch(template) if module is None else native.NativeEngine(template, module)
        self.gate = gate = self._gated(inner)
        for r in runs:
            _load(gate, r)

    def _gated(self, inner: FromScratch | native.NativeEngine) -> Gated:
        engine = Gated(inner)
        engine.live_elsewhere = self.runs.__contains__  # (live runs the engine does not hold)
        engine.forget_ended = True  # ``_resolve`` asks the store for the others: stays bounded
        self.gate = engine
        self._resolve(list(self.runs.values()))
        return engine


def _load(engine: Gated, run: Run) -> None:
    """Put a live run where the engine keeps it: queued, or holding its placement."""
    if run.phase is Phase.PENDING:
        engine.submit(run)
    elif run.phase in ACTIVE_PHASES and run.placement is not None:
        engine.add_active(run)


def _seq(run: Run) -> int:
    return run.seq


def _static(s: Snapshot) -> tuple[object, ...]:
    """What of a template the engine is built around (not the clock, usage or runs)."""
    return (
        s.nodes,
        tuple(sorted(s.projects.items())),
        tuple(sorted(s.priority_classes.items())),
        tuple(sorted(s.cohorts.items())),
        s.policy,
        tuple(sorted(s.capabilities.items())),
        tuple(sorted(s.gpu_types.items())),
    )
