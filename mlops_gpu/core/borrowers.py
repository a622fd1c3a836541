"""Shortest-first preemption across projects: taking a long run that borrows.

Under ``order: shortest`` a run R preempts a run of its own project and class expected to run
on for more than ``shortest_preempt_ratio`` x R's whole ``max_runtime``. With
``policy.shortest_preempt_borrowers`` (off by default) R may also preempt such a run V of
ANOTHER project when all of these hold:
- V's project P is in R's cohort tree and borrowed V's GPU type when the cycle began
  (``CycleBooks.borrowed_at_start``, the usage the reclaim of lent quota reads);
- V is of R's class and expected to run on for more than the ratio x R's ``max_runtime``
  (``CycleBooks.outlasts``; a run without ``max_runtime`` never is);
- P's fair share with V gone (``Shares.share_with``, from the shares as the cycle's order reads
  them at that moment) stays more than ``borrower_share_ratio`` (>= 1) times R's project's with
  R admitted (each victim alone in ``share_above``, the whole plan in ``keeps``): the move
  never turns the two projects' order around, so it only narrows the gap between them
  (shares are divided by the projects' weights, so a ratio, not a difference, is the margin
  that means the same at every scale; without fair share every share is 0: the rule never
  applies);
- V is ready as a same-class victim of R's own project must be (the Day-one rules,
  ``cycle_victims.ready``: a checkpoint reported unless ``preempt_uncheckpointed``, and at least
  ``min_runtime_before_preemption_s`` run);
- the plan does not trade places (``keeps``): with the plan's victims gone, either R's project
  stays within its nominal quota with R placed, or no such victim would be within its own
  project's nominal quota if it were queued again. Else the victim, requeued within nominal,
  would reclaim R's borrowed GPUs at once.
Quota is judged as for every plan (``QuotaBook.admits`` with the victims gone), so R never
exceeds its project's limits. A victim and its preemptor never swap back: V's time to go
exceeds the ratio (>= 1) x R's whole max_runtime, so R's time to go can never exceed the ratio x
V's max_runtime.

Split of the conditions: ``may_ever`` holds only what time cannot make true (the borrowing at
the start; a time to go only shrinks), which the search uses to prune
(``preempt._could_fit_without_all``); the share comparison changes with the clock and with each
admission, so it is part of ``ready``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from mlops_gpu.core.backfill import expected_end
from mlops_gpu.core.placement import request_amount
from mlops_gpu.model import Placement, Run

if TYPE_CHECKING:
    from mlops_gpu.core.cycle_books import CycleBooks

_EPS = 1e-9


def enabled(c: CycleBooks) -> bool:
    """Whether the rule applies in this cycle's policy."""
    p = c.snap.policy
    return p.shortest_preempt_borrowers and p.order == "shortest" and p.preemption


def may_ever(c: CycleBooks, run: Run, victim: Run) -> bool:
    """The rule's conditions that time cannot make true (``victim`` of another project)."""
    if not enabled(c) or victim.placement is None:
        return False
    snap = c.snap
    if snap.priority_of(victim) != snap.priority_of(run):
        return False
    root = c.quota.root.get(victim.project)
    if root is None or root != c.quota.root.get(run.project):
        return False
    if not c.borrowed_at_start(victim.project, victim.placement.gpu_type):
        return False
    end = expected_end(snap, victim)
    return end is not None and c.outlasts(run, end - snap.now)


def share_above(c: CycleBooks, run: Run, victim: Run) -> bool:
    """Whether ``victim``'s project's fair share without it stays above the ratio x
    ``run``'s project's with ``run`` admitted on the victim's GPU type."""
    placed = victim.placement
    assert placed is not None
    s, t = c.shares, placed.gpu_type
    theirs = s.share_with(victim.project, t, -placed.gpu_amount)
    mine = s.share_with(run.project, t, request_amount(run))
    return theirs > mine * c.snap.policy.borrower_share_ratio + _EPS


def _above(c: CycleBooks, theirs: str, mine: str) -> bool:
    ratio = c.snap.policy.borrower_share_ratio
    return c.shares.share(theirs) > c.shares.share(mine) * ratio + _EPS


def possible(c: CycleBooks, run: Run, gpu_type: str) -> bool:
    """Whether a run of another project might be the rule's victim for ``run`` on
    ``gpu_type`` now (an over-estimate of ``may_ever`` and ``share_above``; False is
    certain; the shares before the move bound those after it): ``cycle_victims.possible``
    asks it."""
    if not enabled(c):
        return False
    root = c.quota.root.get(run.project)
    if root is None:
        return False
    cls = c.snap.priority_of(run)
    for m in c.lenders_at_start(root, gpu_type):
        if m == run.project or not c.outlasts(run, _to_go(c, m, gpu_type, cls)):
            continue
        if _above(c, m, run.project):
            return True
    return False


def _to_go(c: CycleBooks, project: str, gpu_type: str, cls: int) -> float:
    return c.state.longest_to_go(project, gpu_type, cls, c.snap.now)


def taken_by_rule(c: CycleBooks, run: Run, victim: Run) -> bool:
    """Whether ``victim`` (chosen for ``run``) was taken by this rule, not by the reclaim of
    lent quota or as a lower class: for the plan's check and the preemption's message."""
    return (
        victim.project != run.project
        and c.snap.priority_of(victim) == c.snap.priority_of(run)
        and not c.reclaims(run, victim)
    )


def keeps(c: CycleBooks, run: Run, victims: Iterable[Run], placement: Placement) -> bool:
    """Whether the plan keeps the order of shares and does not trade places (see the module
    docstring): ``ready`` judged each victim alone, this judges the plan's whole move."""
    victims = list(victims)
    taken = [v for v in victims if taken_by_rule(c, run, v)]
    if not taken:
        return True
    if not _keeps_order(c, run, victims, taken, placement):
        return False
    gone = [v for v in victims if v.placement is not None]
    for v in gone:
        c.cap.release(v.project, v.placement, v.request.gpu_types)  # type: ignore[arg-type]
    try:
        t, q = placement.gpu_type, c.quota
        if q.within_nominal(run.project, t, placement.gpu_amount):
            return True
        return not any(q.within_nominal(v.project, t, request_amount(v)) for v in taken)
    finally:
        for v in gone:
            c.cap.take(v.project, v.placement, v.request.gpu_types)  # type: ignore[arg-type]


def _keeps_order(
    c: CycleBooks, run: Run, victims: list[Run], taken: list[Run], placement: Placement
) -> bool:
    """With every victim gone and ``run`` placed, each project a victim was taken from by this
    rule keeps a share above the ratio x ``run``'s project's."""
    t = placement.gpu_type
    freed: dict[str, float] = {}
    for v in victims:
        if v.placement is not None and v.placement.gpu_type == t:
            freed[v.project] = freed.get(v.project, 0.0) + v.placement.gpu_amount
    s, ratio = c.shares, c.snap.policy.borrower_share_ratio
    mine = s.share_with(run.project, t, placement.gpu_amount - freed.get(run.project, 0.0))
    return all(
        s.share_with(p, t, -freed.get(p, 0.0)) > mine * ratio + _EPS
        for p in sorted({v.project for v in taken})
    )


def why(c: CycleBooks, run: Run, victim: Run) -> str:
    """The preemption's message for a victim taken by this rule."""
    s = c.shares
    return taken_text(run, victim.project, s.share(victim.project), s.share(run.project))


def taken_text(run: Run, victim_project: str, theirs: float, mine: float) -> str:
    """``why``'s sentence from the two projects' fair shares (the native engine hands them
    back with each victim it took by this rule: ``_engine.Preempted.borrower_shares``)."""
    return (
        f"preempted for run {run.id} of project {run.project} (shortest first across "
        f"projects: project {victim_project} was borrowing, at fair share "
        f"{theirs:.3f} against {mine:.3f})"
    )
