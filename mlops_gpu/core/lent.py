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
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Run

#: At most this many runs are named per borrower and kind; the rest are counted.
SHOWN = 5


class Held:
    def __init__(self, snap: Snapshot, active: Iterable[Run], going: set[str]) -> None:
        self.snap = snap
        self.by: dict[tuple[str, str], list[Run]] = defaultdict(list)
        for a in active:
            if a.placement is not None and a.id not in going and not a.preempt_requested:
                self.by[(a.project, a.placement.gpu_type)].append(a)
        for runs in self.by.values():
            runs.sort(key=lambda r: r.id)

    def _end(self, run: Run) -> str:
        end = expected_end(self.snap, run)
        return "no max_runtime" if end is None else f"ends by {end:.0f}"

    def _names(self, runs: list[Run]) -> str:
        shown = ", ".join(f"{r.id} ({self._end(r)})" for r in runs[:SHOWN])
        more = len(runs) - SHOWN
        return shown if more <= 0 else f"{shown} and {more} more"

    def runs(self, project: str, gpu_type: str) -> str:
        """``(reclaimable: ...; not preemptible, which cannot be reclaimed: ...)`` for the
        runs of ``project`` on ``gpu_type``; "" when it holds none."""
        runs = self.by.get((project, gpu_type), [])
        parts = []
        yes = [r for r in runs if r.spec.preemptible]
        no = [r for r in runs if not r.spec.preemptible]
        if yes:
            parts.append(f"reclaimable: {self._names(yes)}")
        if no:
            parts.append(f"not preemptible, which cannot be reclaimed: {self._names(no)}")
        return f" ({'; '.join(parts)})" if parts else ""
