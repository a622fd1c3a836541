"""What a lender's pending run says about the borrowers holding its cohort's quota.

A run within its project's nominal quota that waits for capacity while other members of its
cohort tree borrow its GPU type names, per borrowing project, the runs through which it
borrows: those that are preemptible (reclaimable: the run may take them back) and those that
are not (started before the rule that only a preemptible run may borrow, or before a quota
change; they cannot be reclaimed), each with its expected end (``backfill.expected_end``) or
"no max_runtime". Runs chosen as victims in the cycle hold nothing and are left out.

Built once per cycle, on the first question (``Held``): the active runs grouped by (project,
type), so a cycle with many blocked lenders reads the active runs once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from mlops_gpu.core.backfill import expected_end
from mlops_gpu.core.reason_text import SHOWN, runs_held
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Run


class Held:
    def __init__(self, snap: Snapshot, active: Iterable[Run], going: set[str]) -> None:
        self.snap = snap
        self.by: dict[tuple[str, str], list[Run]] = defaultdict(list)
        for a in active:
            if a.placement is not None and a.id not in going and not a.preempt_requested:
                self.by[(a.project, a.placement.gpu_type)].append(a)
        for runs in self.by.values():
            runs.sort(key=lambda r: r.id)

    def _shown(self, runs: list[Run]) -> list[tuple[str, float | None]]:
        return [(r.id, expected_end(self.snap, r)) for r in runs[:SHOWN]]

    def runs(self, project: str, gpu_type: str) -> str:
        """``(reclaimable: ...; not preemptible, which cannot be reclaimed: ...)`` for the
        runs of ``project`` on ``gpu_type``; "" when it holds none (``reason_text.runs_held``)."""
        runs = self.by.get((project, gpu_type), [])
        yes = [r for r in runs if r.spec.preemptible]
        no = [r for r in runs if not r.spec.preemptible]
        return runs_held(self._shown(yes), len(yes), self._shown(no), len(no))
