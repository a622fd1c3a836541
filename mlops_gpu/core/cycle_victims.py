"""``VictimRules``: who may be a victim of a run's preemption (step 5 of ``policy``; the
search itself is ``preempt.find_plan``, called by ``Cycle._preempt``).

Invariants:
- ``_may_preempt`` = ``_may_ever_preempt`` and ``_ready``: the first part only turns false as
  the cycle's clock moves on (the search prunes with it), the second holds
  what time or a checkpoint can make true (rule B: a victim of the run's own project and class
  has reported a checkpoint, unless ``preempt_uncheckpointed``, and has run
  ``min_runtime_before_preemption_s``).
- A run being preempted (``going``) is never a victim again.
- Borrowing is reclaimed only where the victim's project borrowed when the cycle began
  (``_borrowed_at_start``, from the usage at the start), and only by a run within its own
  project's nominal quota (``_reclaims``).
- ``_victims_possible`` and ``peers`` over-estimate: False is certain (no search could find a
  victim), True is not.
"""

from __future__ import annotations

from collections.abc import Iterable

from mlops_gpu.core import borrowers
from mlops_gpu.core.backfill import expected_end, start_of
from mlops_gpu.core.cycle_books import CycleBooks
from mlops_gpu.core.fairshare import attained_now, las_level
from mlops_gpu.core.placement import request_amount
from mlops_gpu.model import Run


class VictimRules(CycleBooks):
    """Who may be a victim of a run, as the cycle's rules say."""

    def _victims_possible(self, run: Run, types: list[str]) -> bool:
        """Whether any active run might be a victim of ``run`` (a cheap over-estimate: when
        False, the preemption search would find nothing)."""
        if not self.snap.policy.preemption:
            return False
        mine = self.snap.priority_of(run)
        root = self.quota.root.get(run.project)
        amount = request_amount(run)
        for t in types:
            pool = self.state.victim_classes(run.project, t)
            if any(v < mine for v in pool) or (mine in pool and self.peers(run, t)):
                return True
            if borrowers.possible(self, run, t):
                return True
            if root is None or not self.quota.within_nominal(run.project, t, amount):
                continue
            for m in self.lenders_at_start(root, t):
                if m != run.project and self.state.running.get((m, t)):
                    return True
        return False

    def peers(self, run: Run, gpu_type: str) -> bool:
        """Whether a run of the same project and class on ``gpu_type`` might be a victim of
        ``run`` (an over-estimate of ``_may_preempt``; False is certain). Under ``shortest``,
        only when one is expected to go on for more than the ratio x run's max_runtime."""
        cls = self.snap.priority_of(run)
        to_go = self.state.longest_to_go(run.project, gpu_type, cls, self.snap.now)
        return self.peers_going_on(run, to_go)

    def peers_going_on(self, run: Run, to_go: float) -> bool:
        """``peers``, given the most time any same-class victim candidate is expected to go
        on for (``State.longest_to_go``)."""
        order = self.snap.policy.order
        return order == "las" or (order == "shortest" and self._outlasts(run, to_go))

    def _outlasts(self, run: Run, to_go: float) -> bool:
        """Under ``shortest``: whether a run of ``run``'s class with ``to_go`` seconds left
        (infinite when unknown) goes on for more than the ratio x ``run``'s whole
        max_runtime (ratio >= 1, so two runs never swap back)."""
        mine = run.spec.max_runtime_s
        return mine is not None and to_go > mine * self.snap.policy.shortest_preempt_ratio + 1e-9

    def _victim_pool(self, run: Run, gpu_type: str) -> Iterable[Run]:
        """The runs that ``_may_preempt`` could accept for ``run`` on ``gpu_type``: its own
        project's, and those of cohort members that borrowed it when the cycle began (from
        ``State.running``: preemptible, placed on ``gpu_type``, not being preempted)."""
        running = self.state.running
        yield from running.get((run.project, gpu_type), {}).values()
        root = self.quota.root.get(run.project)
        if root is None:
            return
        for m in self.quota.members[root]:
            if m != run.project and self._borrowed_at_start(m, gpu_type):
                yield from running.get((m, gpu_type), {}).values()

    def lenders_at_start(self, root: str, gpu_type: str) -> tuple[str, ...]:
        """The members of cohort tree ``root`` that borrowed ``gpu_type`` when the cycle began,
        sorted."""
        members = self.quota.members[root]
        return tuple(sorted(m for m in members if self._borrowed_at_start(m, gpu_type)))

    def _borrowed_at_start(self, project: str, gpu_type: str) -> bool:
        """Whether the project borrowed ``gpu_type`` when the cycle began: only such borrowing
        is reclaimed (a project that borrows because of this cycle's own admissions does not
        lose a run it started within its quota)."""
        nominal = self.quota.quota(project, gpu_type).nominal
        return self._used_at_start.get((project, gpu_type), 0.0) > nominal + 1e-9

    def _may_preempt(self, run: Run, victim: Run) -> bool:
        """Whether ``victim`` may be a victim of ``run`` now."""
        return self._may_ever_preempt(run, victim) and self._ready(run, victim)

    def _ready(self, run: Run, victim: Run) -> bool:
        """Rule B's conditions that time or a checkpoint can make true (the rest is
        ``_may_ever_preempt``): a victim of ``run``'s own project and class has reported a
        checkpoint (unless ``preempt_uncheckpointed``) and has run for at least
        ``min_runtime_before_preemption_s`` since it started (else was admitted; with
        neither, it has not run). Lower classes and reclaimed borrowing need neither; a run of
        another project taken by ``borrowers`` needs both, and its project's share above."""
        snap = self.snap
        if snap.priority_of(victim) != snap.priority_of(run):
            return True
        if victim.project != run.project:
            if self._reclaims(run, victim):
                return True
            if not borrowers.share_above(self, run, victim):
                return False
        pol = snap.policy
        if victim.last_checkpoint_at is None and not pol.preempt_uncheckpointed:
            return False
        start = start_of(victim)
        return start is not None and snap.now - start >= pol.min_runtime_before_preemption_s

    def _may_ever_preempt(self, run: Run, victim: Run) -> bool:
        """``_may_preempt`` without ``_ready``: the part that only turns false as the cycle's
        clock moves on (under ``shortest`` a victim's time to go shrinks), so the search may
        prune with it (``preempt._could_fit_without_all``)."""
        if victim.id in self.going:
            return False
        snap = self.snap
        if victim.project == run.project:
            mine, theirs = snap.priority_of(run), snap.priority_of(victim)
            if theirs < mine:
                return True
            if theirs > mine:
                return False
            if snap.policy.order == "las":
                return las_level(snap, attained_now(snap, victim)) > las_level(
                    snap, run.attained_gpu_s
                )
            if snap.policy.order == "shortest":
                # a victim without max_runtime has no known end: not one (rule B)
                end = expected_end(snap, victim)
                return end is not None and self._outlasts(run, end - snap.now)
            return False
        return self._reclaims(run, victim) or borrowers.may_ever(self, run, victim)

    def _reclaims(self, run: Run, victim: Run) -> bool:
        """Whether ``run`` may take ``victim`` (another project's) back as lent quota."""
        t = victim.placement.gpu_type if victim.placement else ""
        root = self.quota.root.get(victim.project)
        return (
            root is not None
            and root == self.quota.root.get(run.project)
            and self._borrowed_at_start(victim.project, t)
            and self.quota.within_nominal(run.project, t, request_amount(run))
        )

    def _why_preempted(self, run: Run, v: Run) -> str:
        if v.project == run.project:
            return f"preempted for run {run.id} (priority {run.spec.priority})"
        if borrowers.taken_by_rule(self, run, v):
            return borrowers.why(self, run, v)
        return (
            f"reclaimed: project {run.project} needs its nominal quota back; project "
            f"{v.project} was borrowing"
        )
