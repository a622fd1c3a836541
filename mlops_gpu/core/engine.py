"""A scheduling engine: the core driven by events (submit, finish) instead of whole snapshots.

``FromScratch`` rebuilds a ``Snapshot`` for every cycle and calls ``decide``: the reference.
Both apply their own decisions (admissions become active runs; preemption victims are flagged)
so that a caller (the simulator, a benchmark) only reports submissions and completions.
Pure: the clock comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from mlops_gpu.core.decision import Decision
from mlops_gpu.core.policy import decide
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Phase, Run


class FromScratch:
    def __init__(self, template: Snapshot) -> None:
        """``template`` gives nodes, projects, classes, cohorts, policy and capabilities."""
        self.template = template
        self.pending: dict[str, Run] = {}
        self.active: dict[str, Run] = {}

    def submit(self, run: Run) -> None:
        self.pending[run.id] = run

    def finish(self, run_id: str) -> Run:
        return self.active.pop(run_id)

    def snapshot(self, now: float, usage_history: Mapping[tuple[str, str], float] | None = None,
                 ) -> Snapshot:
        return replace(
            self.template, now=now, pending=tuple(self.pending.values()),
            active=tuple(self.active.values()),
            usage_history=dict(usage_history or self.template.usage_history),
        )

    def cycle(self, now: float, usage_history: Mapping[tuple[str, str], float] | None = None
              ) -> Decision:
        d = decide(self.snapshot(now, usage_history))
        self.apply(d, now)
        return d

    def apply(self, d: Decision, now: float) -> None:
        for a in d.admissions:
            run = self.pending.pop(a.run_id)
            self.active[run.id] = replace(run, phase=Phase.RUNNING, placement=a.placement,
                                          admitted_at=now, started_at=now)
        for p in d.preemptions:
            self.active[p.run_id] = replace(self.active[p.run_id], preempt_requested=True)
