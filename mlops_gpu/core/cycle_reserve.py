"""``work_out``: the anchor's EASY backfill reservation (step 6 of ``policy``), and what
it holds against the other runs of a cycle.

Invariants:
- The reservation is worked out once per cycle, from the cycle's starting state, before the
  first admission (``_try`` asks for it before placing), for the anchor ``anchor.anchor``
  names; it is dropped when the anchor is admitted (``CycleBooks.admit``).
- The anchor itself is never held back by its reservation; a run of a higher class than the
  anchor's ignores it when it preempts (``preempt_hold``: priority wins).
- Another run may take what the reservation holds (nodes, quota) only when it is shown to end
  before the reservation's time (``Reservation.allows``, ``allows_quota``); a run within its own
  nominal quota may also take what a borrowing anchor would borrow.
- ``kept_anchor``: the anchor an engine keeps for its next cycle, this cycle's unless admitted,
  else the oldest run the cycle overtook (``anchor.overtaken``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from mlops_gpu.core import anchor as anchors
from mlops_gpu.core.backfill import (
    Reservation,
    expected_end,
    freed_by_quota,
    quota_limit,
    reserve,
    timelines,
)
from mlops_gpu.core.cycle_books import CycleBooks
from mlops_gpu.core.placement import request_amount
from mlops_gpu.core.preempt import Hold
from mlops_gpu.model import Run


def work_out(c: CycleBooks) -> None:
    """Step 6: the anchor (``anchor.anchor``) and its reservation (``c.reservation``), from the
    cycle's starting state, before any admission. It is dropped once the anchor is admitted
    (``CycleBooks.admit``)."""
    c.worked_out = True
    if not c.snap.policy.backfill:
        return
    anchor = anchors.anchor(c)
    if anchor is None:
        return
    run, types = anchor
    c.anchor = run.id
    # the nodes' timelines of expected ends, from the active runs
    lines = timelines(c.state.view(c.snap.now))
    c.reservation = reserve(c.snap, c.cap, run, types, lines, lambda t: _quota_of(c, run, t))
    if c.reservation is not None:
        _hold_terms(c, run, c.reservation)


def _hold_terms(c: CycleBooks, run: Run, res: Reservation) -> None:
    """What the reservation does not hold against others: whether the anchor borrows
    (then runs within their own nominal quota go first), and the GPUs its own project's
    runs without max_runtime surely free on its nodes before it (its quota waits for them)."""
    t, amount = res.gpu_type, request_amount(run)
    res.borrows = not c.quota.within_nominal(run.project, t, amount)
    if res.limit is None:
        return
    short = c.quota.used[(run.project, t)] + amount - res.limit - res.released
    unknown_on: dict[str, int] = defaultdict(int)
    for a in c.state.held.get((run.project, t), {}).values():
        if a.placement is not None and expected_end(c.snap, a) is None:
            for slot in a.placement.slots:
                unknown_on[slot.node] += len(slot.devices)
    res.freed = freed_by_quota(short, unknown_on, res.nodes)


def _quota_of(
    c: CycleBooks, run: Run, gpu_type: str
) -> tuple[float | None, float, list[tuple[float | None, float]]]:
    """``backfill.QuotaOf`` for the anchor ``run``: the quota it counts on, its project's
    usage, and the expected ends of the project's own runs on the type."""
    limit = quota_limit(c.quota, run.project, gpu_type, request_amount(run), run.spec.preemptible)
    used = c.quota.used[(run.project, gpu_type)]
    if limit is None:
        return None, used, []
    snap = c.snap
    ends = [
        (expected_end(snap, a), float(a.placement.gpu_amount))  # type: ignore[union-attr]
        for a in c.state.held.get((run.project, gpu_type), {}).values()
    ]
    return limit, used, ends


def kept_anchor(c: CycleBooks) -> str | None:
    """The anchor an engine that applies this cycle keeps for the next (``State.anchor``):
    this cycle's, unless it was admitted; else the oldest run the cycle overtook
    (``anchor.overtaken``). Asked after ``work_out`` and ``cycle.schedule``."""
    assert c.worked_out, "cycle_reserve.work_out (step 6) comes first"
    admitted = {a.run_id for a in c.admissions}
    if c.anchor is not None and c.anchor not in admitted:
        return c.anchor
    return anchors.overtaken(c) if c.snap.policy.backfill else None


def backfill_filter(c: CycleBooks, run: Run) -> Callable[..., bool] | None:
    res = c.reservation
    if res is None or res.run_id == run.id:
        return None
    ends = None if run.spec.max_runtime_s is None else c.snap.now + run.spec.max_runtime_s
    if res.borrows and run.project != res.project:
        amount, quota = request_amount(run), c.quota
        return lambda node, free_after: (
            quota.within_nominal(run.project, node.gpu_type, amount)
            or res.allows(node, free_after, ends)
        )
    return lambda node, free_after: res.allows(node, free_after, ends)


def preempt_hold(c: CycleBooks, run: Run) -> Hold:
    """What ``run``'s preemption plan must leave to the reservation: as for backfill, unless
    ``run`` is the anchor or of a higher class (priority wins)."""
    res = c.reservation
    if res is None or res.run_id == run.id:
        return None
    anchor = c.state.pending[res.run_id]
    if c.level(run) > c.level(anchor):
        return None
    flt = backfill_filter(c, run)
    assert flt is not None
    return flt, lambda t, amount: not quota_held(c, run, t, amount)


def quota_held(c: CycleBooks, run: Run, gpu_type: str, amount: float) -> bool:
    """Whether the reservation holds quota that ``run`` taking ``amount`` would take."""
    res = c.reservation
    if res is None or res.run_id == run.id:
        return False
    mr = run.spec.max_runtime_s
    ends = None if mr is None else c.snap.now + mr
    used = c.quota.used[(run.project, gpu_type)]
    return not res.allows_quota(run.project, gpu_type, used + amount, ends)
