"""Who may be a victim of a run's preemption (step 5 of ``policy``; the search itself is
``preempt.find_plan``, called by ``cycle._preempt``). Plain functions over the cycle's books.

Invariants:
- ``may_preempt`` = ``may_ever_preempt`` and ``ready``: the first part only turns false as
  the cycle's clock moves on (the search prunes with it), the second holds what time or a
  checkpoint can make true (rule B: a victim of the run's own project and class has reported
  a checkpoint, unless ``preempt_uncheckpointed``, and has run
  ``min_runtime_before_preemption_s``).
- A run being preempted (``going``) is never a victim again.
- Borrowing is reclaimed only where the victim's project borrowed when the cycle began
  (``CycleBooks.borrowed_at_start``, from the usage at the start), and only by a run within
  its own project's nominal quota (``CycleBooks.reclaims``).
- ``possible`` and ``peers`` over-estimate: False is certain (no search could find a
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


def possible(c: CycleBooks, run: Run, types: list[str]) -> bool:
    """Whether any active run might be a victim of ``run`` (a cheap over-estimate: when
    False, the preemption search would find nothing)."""
    if not c.snap.policy.preemption:
        return False
    mine = c.snap.priority_of(run)
    root = c.quota.root.get(run.project)
    amount = request_amount(run)
    for t in types:
        pool = c.state.victim_classes(run.project, t)
        if any(v < mine for v in pool) or (mine in pool and peers(c, run, t)):
            return True
        if borrowers.possible(c, run, t):
            return True
        if root is None or not c.quota.within_nominal(run.project, t, amount):
            continue
        for m in c.lenders_at_start(root, t):
            if m != run.project and c.state.running.get((m, t)):
                return True
    return False


def peers(c: CycleBooks, run: Run, gpu_type: str) -> bool:
    """Whether a run of the same project and class on ``gpu_type`` might be a victim of
    ``run`` (an over-estimate of ``may_preempt``; False is certain): only where one reported
    a checkpoint (or the policy preempts runs without one); under ``shortest``, only when
    one is expected to go on for more than the ratio x run's max_runtime."""
    cls = c.snap.priority_of(run)
    running = c.state.running.get((run.project, gpu_type), {}).values()
    if not c.snap.policy.preempt_uncheckpointed and not any(
        v.last_checkpoint_at is not None and c.snap.priority_of(v) == cls for v in running
    ):
        return False
    to_go = c.state.longest_to_go(run.project, gpu_type, cls, c.snap.now)
    order = c.snap.policy.order
    return order == "las" or (order == "shortest" and c.outlasts(run, to_go))


def pool(c: CycleBooks, run: Run, gpu_type: str) -> Iterable[Run]:
    """The runs that ``may_preempt`` could accept for ``run`` on ``gpu_type``: its own
    project's, and those of cohort members that borrowed it when the cycle began (from
    ``State.running``: preemptible, placed on ``gpu_type``, not being preempted)."""
    running = c.state.running
    yield from running.get((run.project, gpu_type), {}).values()
    root = c.quota.root.get(run.project)
    if root is None:
        return
    for m in c.quota.members[root]:
        if m != run.project and c.borrowed_at_start(m, gpu_type):
            yield from running.get((m, gpu_type), {}).values()


def may_preempt(c: CycleBooks, run: Run, victim: Run) -> bool:
    """Whether ``victim`` may be a victim of ``run`` now."""
    return may_ever_preempt(c, run, victim) and ready(c, run, victim)


def ready(c: CycleBooks, run: Run, victim: Run) -> bool:
    """Rule B's conditions that time or a checkpoint can make true (the rest is
    ``may_ever_preempt``): a victim of ``run``'s own project and class has reported a
    checkpoint (unless ``preempt_uncheckpointed``) and has run for at least
    ``min_runtime_before_preemption_s`` since it started (else was admitted; with
    neither, it has not run). Lower classes and reclaimed borrowing need neither; a run of
    another project taken by ``borrowers`` needs both, and its project's share above."""
    snap = c.snap
    if snap.priority_of(victim) != snap.priority_of(run):
        return True
    if victim.project != run.project:
        if c.reclaims(run, victim):
            return True
        if not borrowers.share_above(c, run, victim):
            return False
    pol = snap.policy
    if victim.last_checkpoint_at is None and not pol.preempt_uncheckpointed:
        return False
    start = start_of(victim)
    return start is not None and snap.now - start >= pol.min_runtime_before_preemption_s


def may_ever_preempt(c: CycleBooks, run: Run, victim: Run) -> bool:
    """``may_preempt`` without ``ready``: the part that only turns false as the cycle's
    clock moves on (under ``shortest`` a victim's time to go shrinks), so the search may
    prune with it (``preempt._could_fit_without_all``)."""
    if victim.id in c.going:
        return False
    snap = c.snap
    if victim.project == run.project:
        mine, theirs = snap.priority_of(run), snap.priority_of(victim)
        if theirs < mine:
            return True
        if theirs > mine:
            return False
        if snap.policy.order == "las":
            return las_level(snap, attained_now(snap, victim)) > las_level(snap, run.attained_gpu_s)
        if snap.policy.order == "shortest":
            # a victim without max_runtime has no known end: not one (rule B)
            end = expected_end(snap, victim)
            return end is not None and c.outlasts(run, end - snap.now)
        return False
    return c.reclaims(run, victim) or borrowers.may_ever(c, run, victim)


def why_preempted(c: CycleBooks, run: Run, v: Run) -> str:
    if v.project == run.project:
        return f"preempted for run {run.id} (priority {run.spec.priority})"
    if borrowers.taken_by_rule(c, run, v):
        return borrowers.why(c, run, v)
    return (
        f"reclaimed: project {run.project} needs its nominal quota back; project "
        f"{v.project} was borrowing"
    )
