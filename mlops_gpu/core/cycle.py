"""``schedule``: steps 3 to 5 of ``policy``'s numbered steps, over the cycle's books
(``cycle_books.CycleBooks``; the reservation, 6., is ``cycle_reserve``; the explanation, 7.,
``cycle_explain``): serve the priority classes in fair-share order, judge each queue by its
head, place, check quota, and preempt.

Invariants:
- A queue of interchangeable runs is judged by its head: when the head is blocked and its
  followers could do nothing the head could not, they wait for its reason without being tried
  (``Outcome.BLOCKED``); when it waits only for the reservation, the first follower short
  enough to end before it is tried next (``Outcome.RESERVED``).
- Runs within nominal quota, of every class, are served before the runs that borrow, of any
  class (``run``: a borrower must not take what an owner takes back at once).
- Strict FIFO: once a project has a blocked run, its later runs wait behind it (``_turn``);
  a run held only for the reservation of an older run of its own project does not block it.
- A preemption admits its run in the same decision, on the plan's placement; its victims give
  back devices, quota and fair-share usage at once (``_preempt``), and a plan whose run would
  lose the GPUs it frees to a requeued victim is dropped (``_keeps_what_it_frees``).
- Every cycle visits every queue and judges every queue head whose turn comes: no queue is
  skipped for having been blocked before, and no failed search is remembered, so a cycle's
  decision depends only on the state as it begins (and the kept anchor).
- ``_surely_blocked`` is only ever True where ``_try`` would find the run blocked with no side
  effect; its reason is then worked out by ``explain`` (``lazy``). The Rust engine has the same
  test, and it decides which reason such a run gets, so it is part of the reference.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from mlops_gpu.core import anchor, borrowers, cycle_explain, cycle_reserve, cycle_victims
from mlops_gpu.core import reason_text as rt
from mlops_gpu.core.cycle_books import CycleBooks
from mlops_gpu.core.decision import Decision, Preemption, ReasonCode
from mlops_gpu.core.explain import shape_text
from mlops_gpu.core.placement import place, request_amount
from mlops_gpu.core.preempt import find_plan, lost_gpu_s
from mlops_gpu.core.type_choice import order_types
from mlops_gpu.model import Placement, Run


class Outcome(Enum):
    ADMITTED = 1
    #: Fits but for the backfill reservation: an identical run behind it with a short enough
    #: max_runtime could start.
    RESERVED = 4
    #: Blocked, and every identical run behind it would be blocked for the same reason.
    BLOCKED = 2


#: [shape key, next index, end index, the queue]: a range of state.queues[project][shape key]
#: (the queue is held, not looked up: shape keys are long tuples, hashed at each lookup)
Range = list[Any]


def schedule(c: CycleBooks) -> Decision:
    """Steps 3 to 5: every queue head in its turn, admitted, preempted for or left waiting
    (the reservation, 6., is worked out before: ``cycle_reserve.work_out``)."""
    assert c.worked_out, "cycle_reserve.work_out (step 6) comes first"
    levels: dict[int, dict[str, list[Range]]] = defaultdict(lambda: defaultdict(list))
    for project, queues in c.state.queues.items():
        for sk, q in queues.items():
            level = c.level_of(project, int(sk[0]))  # type: ignore[call-overload]
            if q and level is not None:
                levels[level][project].append([sk, 0, len(q), q])
    # Runs within nominal quota, of every class, before the runs that borrow, of any
    # class (a borrower of a higher class must not take what an owner takes back).
    borrowing: list[dict[str, list[Range]]] = []
    for level in sorted(levels, reverse=True):
        deferred: dict[str, list[Range]] = defaultdict(list)
        _serve(c, levels[level], deferred)
        borrowing.append(deferred)
    for deferred in borrowing:
        _serve(c, deferred, None)
    return Decision(tuple(c.admissions), tuple(c.preemptions), tuple(c.reasons.values()))


def _serve(
    c: CycleBooks,
    ranges: Mapping[str, list[Range]],
    defer: dict[str, list[Range]] | None,
) -> None:
    """Serve one priority class in fair-share order: the project with the lowest share
    takes its next run, until every project's runs are admitted, deferred or waiting.
    Without fair share, the project whose next run is oldest goes first (one FIFO
    across projects, as Kueue orders queue heads by creation time)."""
    fair = c.snap.policy.fair_share

    def key(p: str) -> tuple[object, ...]:
        if fair:
            return (c.shares.share(p), p)
        keys = c.state.order_keys
        heads = [keys[rg[3][rg[1]].id] for rg in ranges[p] if rg[1] < rg[2]]
        return (min(heads, default=(0, 0.0, 0)), p)

    heap = [(key(p), p) for p in sorted(ranges) if ranges[p]]
    heapq.heapify(heap)
    while heap:
        _, project = heapq.heappop(heap)
        if _turn(c, project, ranges[project], defer):
            heapq.heappush(heap, (key(project), project))


def _turn(
    c: CycleBooks,
    project: str,
    ranges: list[Range],
    defer: dict[str, list[Range]] | None,
) -> bool:
    """The project's next run in its own order that can start: True once one is admitted,
    False when none can (its queues are then all judged)."""
    keys = c.state.order_keys
    strict = c.snap.policy.queueing == "strict-fifo"
    if project in c.blocked_projects:  # strict FIFO: an older run of it is blocked
        _hold_behind(c, project, ranges, None)
        return False
    while True:
        best: tuple[tuple[int, float, int], Range] | None = None
        for rg in ranges:
            if rg[1] < rg[2]:
                k = keys[rg[3][rg[1]].id]
                if best is None or k < best[0]:
                    best = (k, rg)
        if best is None:
            return False
        rg = best[1]
        run = rg[3][rg[1]]
        if defer is not None and (project in c.deferred_projects or _must_borrow(c, run)):
            for r2 in ranges if strict else [rg]:
                if r2[1] < r2[2]:
                    defer[project].append([r2[0], r2[1], r2[2], r2[3]])
                    r2[1] = r2[2]
            if strict:  # its later runs, of lower classes too, wait behind the borrower
                c.deferred_projects.add(project)
                return False
            continue
        if not strict and _surely_blocked(c, run):
            # It cannot fit anywhere and could change nothing: no placement, no victim,
            # nothing to wait for. ``_try`` would only write its reason, worked out if
            # someone asks (``explain``): quota or capacity, never the reservation.
            c.lazy.add(run.id)
            c.met.append((run, (project, rg[0], rg[1] + 1, rg[2])))
            rg[1] = rg[2]
            continue
        outcome = _try(c, run)
        if outcome is Outcome.ADMITTED:
            c.met.append((run, None))
            rg[1] += 1
            return True
        if strict and not _held_for_own(c, outcome, project):
            c.met.append((run, None))
            c.blocked_projects[project] = run.id
            rg[1] += 1
            _hold_behind(c, project, ranges, run.id)
            return False
        if outcome is Outcome.BLOCKED:  # the rest of this queue waits for the same reason
            c.met.append((run, (project, rg[0], rg[1] + 1, rg[2])))
            rg[1] = rg[2]
        else:  # Outcome.RESERVED
            # Identical runs behind it differ only in max_runtime: those that would not
            # end before the reservation wait for the same reason; try the first that would.
            # (The anchor itself, when it is one of them, is tried: nothing is held from it.)
            res = c.reservation
            assert res is not None
            q, j = rg[3], rg[1] + 1
            latest = res.at - c.snap.now  # (inf when unknown: none ends before)
            while j < rg[2]:
                mr = q[j].spec.max_runtime_s
                if q[j].id == res.run_id or (mr is not None and mr <= latest < math.inf):
                    break
                j += 1
            c.met.append((run, (project, rg[0], rg[1] + 1, j)))
            rg[1] = j


def _held_for_own(c: CycleBooks, outcome: Outcome, project: str) -> bool:
    """Strict FIFO: a run that waits only for the reservation of an older run of its own
    project (by age; under ``shortest`` or ``las`` it may come later in the order) does not
    block the project, or the anchor behind it would never be tried."""
    res = c.reservation
    return (
        outcome is Outcome.RESERVED
        and res is not None
        and c.state.pending[res.run_id].project == project
    )


def _hold_behind(c: CycleBooks, project: str, ranges: list[Range], head: str | None) -> None:
    head = head or c.blocked_projects[project]
    for rg in ranges:
        if rg[1] < rg[2]:
            c.behind.append((project, head, rg[0], rg[1], rg[2]))
            rg[1] = rg[2]


def _must_borrow(c: CycleBooks, run: Run) -> bool:
    amount = request_amount(run)
    return not any(c.quota.within_nominal(run.project, t, amount) for t in c.state.types_of(run))


def _try(c: CycleBooks, run: Run) -> Outcome:
    types = c.state.types_of(run)
    quota_msgs: list[str] = []
    fits_without_reservation = quota_held = False
    flt = cycle_reserve.backfill_filter(c, run)
    placed: dict[str, Placement | None] = {}
    if (
        len(types) > 1
        and run.request.shape != "mig"
        and c.snap.policy.placement == "fragmentation"
        and c.cap.fragmentable
    ):
        # Any of several types: headroom left by restricted runs, then the placement
        # that fragments least (``type_choice``).
        placed = {t: place(c.snap, c.cap, run, t, flt) for t in types}
        types = order_types(c.cap, types, placed, run.request.shape != "cpu")
    for t in types:
        placement = placed[t] if t in placed else place(c.snap, c.cap, run, t, flt)
        if placement is None and flt is not None:
            fits_without_reservation |= place(c.snap, c.cap, run, t) is not None
        amount = placement.gpu_amount if placement else request_amount(run)
        problem = c.quota.problem(run.project, t, amount, run.spec.preemptible)
        if problem is not None:
            quota_msgs.append(problem)
            continue
        if placement is not None:
            if cycle_reserve.quota_held(c, run, t, amount):
                quota_held = True
                continue
            c.admit(run, placement)
            return Outcome.ADMITTED
    res = c.reservation
    if (fits_without_reservation or quota_held) and res is not None:
        # It fits but for the reservation: it waits for it (and does not preempt); a run
        # behind it with a shorter max_runtime may still backfill.
        shape, held = shape_text(run, types), fits_without_reservation
        c.wait(
            run,
            ReasonCode.RESERVED,
            rt.reserved(shape, held, res.run_id, res.project, res.gpu_type, res.at),
        )
        return Outcome.RESERVED
    if cycle_victims.possible(c, run, types) and _preempt(c, run, types):
        return Outcome.ADMITTED  # with its victims, in this decision
    if len(quota_msgs) == len(types) and types:
        c.wait(run, ReasonCode.QUOTA, rt.over_quota(shape_text(run, types), quota_msgs))
    else:
        cycle_explain.wait_capacity(c, run, types)
    return Outcome.BLOCKED


def _surely_blocked(c: CycleBooks, run: Run) -> bool:
    """A cheap test that ``_try`` would find ``run`` blocked with no side effect: on each
    acceptable GPU type it is over quota with nothing left to borrow, or (a whole-GPU
    request) no node set can take it now (``anchor.node_sets``); and no running run could
    be its victim."""
    req = run.request
    types = c.state.types_of(run)
    if c.snap.policy.preemption and cycle_victims.possible(c, run, types):
        return False
    open_types = [t for t in types if not _surely_over_quota(c, run, t)]
    if open_types:
        if req.shape != "whole" or req.topology_key is not None:
            return False
        for t in open_types:
            if anchor.node_sets(c, t, req.gpus, req.nodes, run.spec.backend):
                return False  # it might fit
    return True


def _surely_over_quota(c: CycleBooks, run: Run, gpu_type: str) -> bool:
    """True only when ``QuotaBook.problem`` would name a problem (False: not sure). A
    memory-only shared request is charged its memory's share once placed, less than the
    whole GPU ``request_amount`` counts before: never sure before a place."""
    req = run.request
    if req.shape == "shared" and req.gpu_fraction is None:
        return False
    return request_amount(run) > c.room(run.project, gpu_type) + 1e-9


def _preempt(c: CycleBooks, run: Run, types: list[str]) -> bool:
    """Find victims for ``run`` and, with a plan, admit it in this decision on the plan's
    placement: the victims give back everything they hold (devices, quota, fair-share
    usage), the run takes its placement, and the rest of the victims' devices are free
    for the runs after it. False (nothing changed) without a plan."""
    snap = c.snap
    plan = find_plan(
        snap,
        c.cap,
        c.quota,
        run,
        types,
        lambda r, v: cycle_victims.may_preempt(c, r, v),
        pool=lambda t: cycle_victims.pool(c, run, t),
        may_ever=lambda r, v: cycle_victims.may_ever_preempt(c, r, v),
        hold=cycle_reserve.preempt_hold(c, run),
    )
    if plan is None or not _keeps_what_it_frees(c, run, plan.victims, plan.placement):
        return False
    if not borrowers.keeps(c, run, plan.victims, plan.placement):
        return False
    whys = {v.id: cycle_victims.why_preempted(c, run, v) for v in plan.victims}  # (before any goes)
    for v in plan.victims:
        c.going.add(v.id)
        placed = v.placement
        assert placed is not None
        c.cap.release(v.project, placed, v.request.gpu_types)
        c.shares.add(v.project, placed.gpu_type, -placed.gpu_amount)
        c.preemptions.append(
            Preemption(
                v.id,
                whys[v.id],
                v.spec.checkpoint.signal,
                v.spec.checkpoint.grace_s,
                run.id,
                lost_gpu_s(snap, v),
            )
        )
    c.admit(run, plan.placement)
    return True


def _keeps_what_it_frees(
    c: CycleBooks, run: Run, victims: Iterable[Run], placement: Placement
) -> bool:
    """Whether a run that preempts runs of its own class (``las``, ``shortest``) would get
    the GPUs it frees. The runs within nominal quota (of every class) are served before the
    runs that borrow: if the run would borrow once its victims are gone while one of those
    victims, requeued, would not, the victim takes its GPUs back first and the two trade
    places forever. So either the run is within nominal then, or every such victim would
    borrow too (and comes after the run in its project's order)."""
    snap = c.snap
    mine = snap.priority_of(run)
    peers = [v for v in victims if v.project == run.project and snap.priority_of(v) == mine]
    if not peers:
        return True
    gone = [a for a in victims if a.project == run.project and a.placement is not None]
    for a in gone:
        c.cap.release(a.project, a.placement, a.request.gpu_types)  # type: ignore[arg-type]
    try:
        t, q = placement.gpu_type, c.quota
        if q.within_nominal(run.project, t, placement.gpu_amount):
            return True
        return not any(
            q.within_nominal(run.project, t, v.placement.gpu_amount)  # type: ignore[union-attr]
            for v in peers
        )
    finally:
        for a in gone:
            c.cap.take(a.project, a.placement, a.request.gpu_types)  # type: ignore[arg-type]
