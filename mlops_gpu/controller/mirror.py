"""``Mirror``: the controller's copy of the live runs and the incremental core kept in step with
the store through its change feed, so that a tick costs what changed, not the queue's length.

- ``refresh`` reads the runs changed since the last revision seen (``Store.changed_since``) and
  moves each in the engine: out of wherever it was (pending or active), in where the store now
  has it (pending; active with a placement; nowhere once terminal). The first refresh, and any
  after ``reset``, loads every live run (``Store.live_runs``) into a fresh engine.
- ``cycle`` runs one cycle of the incremental engine (``core.engine.Incremental``), whose
  decisions equal ``decide`` on the same snapshot (the core's differential test). The engine
  applies its own decision; the store writes that follow come back through the feed and replace
  the engine's copies, so a write that did not happen (an admission refused because the run was
  cancelled meanwhile) is undone by the cancel's own change.
- The node inventory, the config's projects and policy are compared each tick; a change
  rebuilds the engine around the same runs.

Invariant: after ``refresh``, ``runs`` holds exactly the store's non-terminal runs as of the
revision read, and the engine holds the same runs in the same phases.
"""

from __future__ import annotations

from collections.abc import Mapping

from mlops_gpu.core.decision import Decision, PendingReason
from mlops_gpu.core.engine import Incremental
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import ACTIVE_PHASES, TERMINAL_PHASES, Phase, Run
from mlops_gpu.state import Store


class Mirror:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.runs: dict[str, Run] = {}
        self.rev: int | None = None
        self.engine: Incremental | None = None
        self._template: Snapshot | None = None

    def reset(self) -> None:
        """Forget everything: the next refresh reloads the live runs from the store."""
        self.rev, self.engine, self._template, self.runs = None, None, None, {}

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
            self._learn(run)

    def pending(self) -> list[Run]:
        return sorted((r for r in self.runs.values() if r.phase is Phase.PENDING), key=_seq)

    def active(self) -> list[Run]:
        return sorted((r for r in self.runs.values() if r.phase in ACTIVE_PHASES), key=_seq)

    def cycle(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float],
        spent: Mapping[str, tuple[float, float]],
    ) -> Decision:
        assert self.engine is not None, "refresh first"
        return self.engine.cycle(now, usage_history, spent)

    def explain(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float],
        spent: Mapping[str, tuple[float, float]],
    ) -> list[PendingReason]:
        assert self.engine is not None, "refresh first"
        return self.engine.explain_all(now, usage_history, spent)

    # -- keeping the engine in step ----------------------------------------------------
    def _note(self, run: Run) -> None:
        if run.phase in TERMINAL_PHASES:
            self.runs.pop(run.id, None)
        else:
            self.runs[run.id] = run

    def _forget(self, run_id: str) -> None:
        assert self.engine is not None
        st = self.engine.state
        if run_id in st.pending:
            st.remove_pending(run_id)
        elif run_id in st.active:
            st.finish(run_id)

    def _learn(self, run: Run) -> None:
        assert self.engine is not None
        if run.phase is Phase.PENDING:
            self.engine.submit(run)
        elif run.phase in ACTIVE_PHASES and run.placement is not None:
            self.engine.state.add_active(run)

    def _differs(self, template: Snapshot) -> bool:
        t = self._template
        return t is None or _static(t) != _static(template)

    def _rebuild(self, template: Snapshot) -> None:
        self._template = template
        active = tuple(
            r for r in self.runs.values() if r.phase in ACTIVE_PHASES and r.placement is not None
        )
        pending = (r for r in self.runs.values() if r.phase is Phase.PENDING)
        engine = Incremental(template)
        for a in sorted(active, key=_seq):
            engine.state.add_active(a)
        for p in sorted(pending, key=_seq):
            engine.submit(p)
        self.engine = engine


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
