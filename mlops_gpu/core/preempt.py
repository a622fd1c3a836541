"""Victim selection: which running runs to stop so that a blocked run fits.

Who may be a victim of run R (on the GPU type R would use):
- a preemptible run of R's own project with a lower effective priority (under ``las`` order,
  also one of equal priority that has attained more service, in a later LAS level);
- a preemptible run of another project of R's cohort tree that is borrowing that type, when R
  would stay within its own nominal quota (reclaiming lent quota).
Same-class victims (R's project and class) must also be ready (``cycle_victims.ready``: a checkpoint
reported, the minimum runtime run). Runs already being preempted hold nothing in the core (their
devices are free or their preemptor's), so they are neither counted nor chosen again. Among
sufficient sets, the search prefers victims of the lowest classes (the highest class among
them, lowest first), then the fewest GPU-hours lost since each victim's last checkpoint (or
start), then the fewest victims: a greedy pass in that order (class, then cost) around each
candidate node, then a pruning pass that gives back the highest class and most expensive
first and keeps every victim that is still needed. Classes come first so that a preemption
ends: a victim of a higher class, requeued, would preempt its own project's lower-class runs
in turn (a reclaim that took a borrower's high-class run cost the borrower its low-class ones
too); taking the lowest first stops there, one GPU preempted per GPU needed for same-size runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.placement import NodeFilter, eligible_nodes, free_counts, place
from mlops_gpu.core.quota import QuotaBook
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Placement, Run

#: How many anchor nodes the search tries per GPU type (the most promising first).
MAX_ANCHORS = 12


@dataclass(frozen=True)
class Plan:
    victims: tuple[Run, ...]
    placement: Placement
    lost_gpu_s: float


def lost_gpu_s(snap: Snapshot, run: Run) -> float:
    """GPU-seconds of work a victim loses: since its last checkpoint, else since it started."""
    assert run.placement is not None
    since = 0.0  # the latest of them (a loop, not a generator: asked of every candidate)
    for t in (run.last_checkpoint_at, run.started_at, run.admitted_at):
        if t is not None and t > since:
            since = t
    return run.placement.gpu_amount * max(snap.now - since, 0.0)


#: What a plan must leave to the anchor's reservation (``cycle_reserve.preempt_hold``): a node
#: filter for ``place``, and whether the run may take an amount of a GPU type's quota; None:
#: nothing.
Hold = tuple[NodeFilter, Callable[[str, float], bool]] | None


def find_plan(
    snap: Snapshot,
    cap: Capacity,
    quota: QuotaBook,
    run: Run,
    gpu_types: list[str],
    may_preempt: Callable[[Run, Run], bool],
    pool: Callable[[str], Iterable[Run]],
    may_ever: Callable[[Run, Run], bool] | None = None,
    hold: Hold = None,
) -> Plan | None:
    """The cheapest sufficient set of victims for ``run``, or None. ``cap`` and ``quota`` are
    restored before returning. ``pool(gpu_type)`` yields preemptible active runs placed on
    that type, a superset of the possible victims there (an index, instead of scanning every
    active run). ``may_ever`` (default ``may_preempt``): a superset of ``may_preempt`` that
    time cannot make true (no minimum runtime, no checkpoint). ``hold``: the placement and
    quota the run must leave to the reservation (it only narrows the search)."""
    ever = may_preempt if may_ever is None else may_ever
    best: Plan | None = None
    for t in gpu_types:
        plan = _plan_for_type(snap, cap, quota, run, t, may_preempt, ever, pool(t), hold)
        if plan is not None and (best is None or _rank(snap, plan) < _rank(snap, best)):
            best = plan
    return best


def _rank(snap: Snapshot, plan: Plan) -> tuple[int, float, int]:
    """Plans compare by their highest victim class, then the GPU-seconds lost, then the
    number of victims: the fewest lower first."""
    top = max(snap.priority_of(v) for v in plan.victims)
    return (top, plan.lost_gpu_s, len(plan.victims))


def _placement(run: Run) -> Placement:
    assert run.placement is not None, f"active run {run.id} has no placement"
    return run.placement


def _fits(
    snap: Snapshot, cap: Capacity, quota: QuotaBook, run: Run, t: str, hold: Hold
) -> Placement | None:
    placed = place(snap, cap, run, t, None if hold is None else hold[0])
    if placed is None or not _admits(quota, run, t, placed.gpu_amount, hold):
        return None
    return placed


def _admits(quota: QuotaBook, run: Run, t: str, amount: float, hold: Hold) -> bool:
    return quota.admits(run.project, t, amount, run.spec.preemptible) and (
        hold is None or hold[1](t, amount)
    )


def _plan_for_type(
    snap: Snapshot,
    cap: Capacity,
    quota: QuotaBook,
    run: Run,
    t: str,
    may_preempt: Callable[[Run, Run], bool],
    may_ever: Callable[[Run, Run], bool],
    source: Iterable[Run],
    hold: Hold = None,
) -> Plan | None:
    pool = list(source)
    if not pool:
        return None
    whole = run.request.shape == "whole"
    if whole and not _could_fit_without_all(snap, cap, run, t, pool):
        return None  # not even with every run of the pool gone: skip the per-victim rules
    ever = [a for a in pool if may_ever(run, a)]
    if not ever:
        return None
    if whole and len(ever) < len(pool) and not _could_fit_without_all(snap, cap, run, t, ever):
        return None  # not even with every run that could ever be a victim gone
    cands = [a for a in ever if may_preempt(run, a)] if may_ever is not may_preempt else ever
    if not cands:
        return None
    if whole and len(cands) < len(ever) and not _could_fit_without_all(snap, cap, run, t, cands):
        return None  # every greedy order ends with all candidates gone: none would succeed
    cost = {a.id: lost_gpu_s(snap, a) for a in cands}
    cands.sort(key=lambda a: (snap.priority_of(a), cost[a.id], -(a.admitted_at or 0.0), a.id))
    if hold is not None and not _fits_without(snap, cap, quota, run, t, cands, hold):
        return None  # held off what it needs: fitting only gets easier as victims go
    on_node: dict[str, list[Run]] = {}
    for a in cands:
        for node in _placement(a).node_names:
            on_node.setdefault(node, []).append(a)

    def room(name: str) -> int:  # free now plus what its candidates hold
        return len(cap.free[name]) + sum(_placement(a).total_gpus for a in on_node[name])

    eligible = eligible_nodes(snap, cap, run, t)
    nodes = [n for n in eligible if n.name in on_node]
    nodes.sort(key=lambda n: (-room(n.name), n.name))
    orders = []
    for n in nodes[:MAX_ANCHORS]:
        local = {a.id for a in on_node[n.name]}
        orders.append([*on_node[n.name], *(a for a in cands if a.id not in local)])
    orders = orders or [cands]
    best: Plan | None = None
    for order in orders:
        plan = _greedy(snap, cap, quota, run, t, order, cost, hold)
        if plan is not None and (best is None or _rank(snap, plan) < _rank(snap, best)):
            best = plan
    return best


def _fits_without(
    snap: Snapshot, cap: Capacity, quota: QuotaBook, run: Run, t: str, cands: list[Run], hold: Hold
) -> bool:
    """Whether ``run`` fits on ``t`` (``_fits``, with ``hold``) with every candidate gone."""
    for a in cands:
        cap.release(a.project, _placement(a), a.request.gpu_types)
    fits = _fits(snap, cap, quota, run, t, hold) is not None
    for a in cands:
        cap.take(a.project, _placement(a), a.request.gpu_types)
    return fits


def _could_fit_without_all(
    snap: Snapshot, cap: Capacity, run: Run, t: str, cands: list[Run]
) -> bool:
    """Whether a whole-GPU ``run`` might fit on ``t`` with every candidate gone: per backend,
    the nodes with ``gpus`` free now plus the nodes that reach it with
    the candidates' devices back, at least ``nodes`` of them. Only nodes the candidates hold
    are looked at, so the test costs what the pool holds, not the cluster's size. An upper
    bound (host resources are not checked), so False is certain."""
    req = run.request
    # the backends that may host it: their nodes already fitting
    count = free_counts(snap, cap, t, run.spec.backend, req.nodes, req.gpus)
    if any(k >= req.nodes for k in count.values()):
        return True
    freed: dict[str, int] = defaultdict(int)
    for a in cands:
        for slot in _placement(a).slots:
            freed[slot.node] += len(slot.devices)
    for name, back in freed.items():
        node = cap.nodes.get(name)
        if node is None or node.gpu_type != t or not node.schedulable or node.backend not in count:
            continue
        free = len(cap.free[name])
        if free < req.gpus <= free + back:
            count[node.backend] += 1
            if count[node.backend] >= req.nodes:
                return True
    return False


def _greedy(
    snap: Snapshot,
    cap: Capacity,
    quota: QuotaBook,
    run: Run,
    t: str,
    order: list[Run],
    cost: dict[str, float],
    hold: Hold,
) -> Plan | None:
    # Two exact shortcuts spare placement searches whose answer is known (the search is the
    # cost of preemption): a whole-GPU run that found no node cannot find one after a release
    # that leaves none of the victim's nodes with enough free GPUs (every other node is as it
    # was); and the prune's state with the last of several victims taken back is the greedy
    # pass's last failing state (with one victim it is the state before the search, which the
    # search does not judge itself).
    need = run.request.gpus if run.request.shape == "whole" else None
    chosen: list[Run] = []
    placed = None
    nowhere = False  # the last search found no node at all (not merely a quota problem)
    for a in order:
        cap.release(a.project, _placement(a), a.request.gpu_types)
        chosen.append(a)
        if nowhere and need is not None and not _reaches(cap, a, need):
            continue
        where = place(snap, cap, run, t, None if hold is None else hold[0])
        nowhere = where is None
        if where is not None and _admits(quota, run, t, where.gpu_amount, hold):
            placed = where
            break
    if placed is None:
        for a in chosen:
            cap.take(a.project, _placement(a), a.request.gpu_types)
        return None
    # Prune: give back every victim the run can do without, most expensive first.
    last, kept = chosen[-1], list(chosen)
    for a in sorted(chosen, key=lambda a: (-snap.priority_of(a), -cost[a.id])):
        cap.take(a.project, _placement(a), a.request.gpu_types)
        known = a is last and len(kept) == len(chosen) > 1
        still = None if known else _fits(snap, cap, quota, run, t, hold)
        if still is not None:
            kept = [k for k in kept if k is not a]
            placed = still
        else:
            cap.release(a.project, _placement(a), a.request.gpu_types)
    for a in kept:
        cap.take(a.project, _placement(a), a.request.gpu_types)
    return Plan(tuple(sorted(kept, key=lambda a: a.id)), placed, sum(cost[a.id] for a in kept))


def _reaches(cap: Capacity, victim: Run, need: int) -> bool:
    """Whether one of the victim's nodes has ``need`` whole GPUs free (after its release)."""
    return any(len(cap.free.get(n, ())) >= need for n in _placement(victim).node_names)
