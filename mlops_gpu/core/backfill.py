"""Time: EASY backfill reservations and estimated start times, from active runs' expected ends.

A run's expected end is its start (or admission) plus ``max_runtime``; a run without
``max_runtime`` has no known end. A run being preempted holds nothing in the core (its devices
are free, or taken by its preemptor's admission), so it has no place in any timeline.

Reservation (for the anchor, ``anchor.anchor``: the run of the highest class that has waited
longest among those that could ever be admitted, blocked as the cycle begins or kept from the
last cycle, where it was the anchor or was overtaken (``anchor.overtaken``); one that fits now
is reserved at ``now``):
- devices: on specific nodes, those that need the fewest GPUs released by runs without a known
  end, then free up earliest (by expected ends), then by name; its device time is when they
  have the GPUs free, unknown (``math.inf``) when it waits for a run without ``max_runtime``;
- quota: the quota the anchor counts on on that GPU type (its nominal when the run fits in it,
  else nominal plus borrowing limit), and when enough of its project's own runs will have
  ended to make room (unknown when one it waits for has no ``max_runtime``);
- its time ``at`` is the later of the two (unknown when either is).
Another run may use a reserved node only if it can be shown to end (by ``max_runtime``) before
``at`` (with ``at`` unknown, none can), or if the node still has the reserved GPUs free at
``at`` after it took its own, counting only releases by runs with a known end. A run of the
anchor's project on its GPU type may take quota only on the same terms: it ends before ``at``,
or the anchor's amount still fits the quota at ``at`` after it took its share. So nothing takes
what the anchor waits for, and it starts once the runs holding its GPUs and quota end. A
preemption plan is held to the same terms (its victims' GPUs and quota count as free), unless
its run is the anchor or of a higher class (``cycle_reserve.preempt_hold``).

ETA (for every pending run): per GPU type, the earliest time the GPUs free now plus
those released by then cover the run's need plus the needs of the pending runs ahead of it;
a run ahead with ``max_runtime`` releases its GPUs again at its own ETA plus its
``max_runtime`` (as a queue drains), one without holds them for good. A run waiting for quota
its cohort lends (no borrowing limit, no lending limits in the tree) waits for the tree's
members to hold no more than their nominal quotas together (``quota_eta``). This ignores node
boundaries: an estimate, said to be one. Since it reads ``max_runtime`` (a limit, not a
prediction) it is a pessimistic bound while the queue keeps its order.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import accumulate

from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.placement import eligible_nodes
from mlops_gpu.core.quota import QuotaBook
from mlops_gpu.core.reason_text import NO_ETA, quota_unknown
from mlops_gpu.core.reason_text import held_unknown as held_unknown_text
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Node, Run


def start_of(run: Run) -> float | None:
    """When the run started or, before it is reported started, was admitted (None: neither).
    (Plain tests, not a generator: this is asked of every victim candidate in a search.)"""
    started = run.started_at
    return started if started is not None else run.admitted_at


def expected_end(snap: Snapshot, run: Run) -> float | None:
    """When an active run is expected to end (None: unknown). Callers skip runs being
    preempted (``preempt_requested``): they hold nothing."""
    mr = run.spec.max_runtime_s
    if mr is None:
        return None
    start = start_of(run)
    return max((snap.now if start is None else start) + mr, snap.now)


_EPS = 1e-9


@dataclass
class Reservation:
    run_id: str
    at: float  # math.inf: unknown (it waits for a run without max_runtime)
    need: int  # GPUs per reserved node
    nodes: dict[str, list[tuple[float, int]]]  # node -> its (end, GPUs released) timeline
    #: the anchor's quota hold: project, GPU type, amount, the quota it counts on (None: none)
    project: str = ""
    gpu_type: str = ""
    amount: float = 0.0
    limit: float | None = None
    #: the project's GPUs of ``gpu_type`` released by runs with a known end by ``at``
    released: float = 0.0
    #: reserved nodes that wait for runs without max_runtime; whether its quota does
    unknown_nodes: tuple[str, ...] = ()
    quota_unknown: bool = False
    #: whether the anchor must borrow on ``gpu_type``: then it holds nothing from a run of
    #: another project within that project's nominal quota (a loan never comes before an
    #: owner's use; ``cycle_reserve.backfill_filter``)
    borrows: bool = False
    #: node -> GPUs that runs of the anchor's own project without max_runtime surely release
    #: there before ``at`` (its quota waits for them to end; ``freed_by_quota``)
    freed: dict[str, int] = field(default_factory=dict)

    def released_by(self, node: str, t: float) -> int:
        return sum(n for end, n in self.nodes.get(node, ()) if end <= t)

    def before(self, ends_at: float | None) -> bool:
        """Whether a run ending at ``ends_at`` is shown to end before the reservation."""
        return ends_at is not None and self.at != math.inf and ends_at <= self.at

    def allows(self, node: Node, free_after: int, ends_at: float | None) -> bool:
        """May a run leaving ``free_after`` free on ``node`` start now without delaying us?"""
        if node.name not in self.nodes:
            return True
        if self.before(ends_at):
            return True
        released = self.released_by(node.name, self.at) + self.freed.get(node.name, 0)
        return free_after + released >= self.need

    def allows_quota(
        self, project: str, gpu_type: str, used_after: float, ends_at: float | None
    ) -> bool:
        """May a run leaving ``project`` at ``used_after`` of ``gpu_type`` start now without
        taking quota the anchor waits for?"""
        if self.limit is None or project != self.project or gpu_type != self.gpu_type:
            return True
        if self.before(ends_at):
            return True
        return used_after - self.released + self.amount <= self.limit + _EPS


def quota_limit(
    quota: QuotaBook, project: str, gpu_type: str, amount: float, preemptible: bool = True
) -> float | None:
    """The quota of ``gpu_type`` a reservation holds for a run of ``amount`` in ``project``:
    its nominal when the run fits in it, else nominal plus borrowing limit (what the project
    may hold at most); None when there is nothing to hold (it may borrow without a limit) or
    the run could never be admitted (``could_be_admitted`` tells them apart)."""
    q = quota.quota(project, gpu_type)
    if amount <= q.nominal + _EPS:
        return float(q.nominal)
    if not preemptible or quota.root.get(project) is None or q.borrowing_limit is None:
        return None
    limit = float(q.nominal + q.borrowing_limit)
    return limit if amount <= limit + _EPS else None


def freed_by_quota(
    short: float, unknown_on: Mapping[str, int], nodes: Iterable[str]
) -> dict[str, int]:
    """What an anchor waiting for ``short`` GPUs of its project's quota to be released by runs
    without max_runtime (``unknown_on``: node -> their GPUs there) surely gets back on each of
    ``nodes`` before it starts: whatever the others could not release alone."""
    if short <= _EPS:
        return {}
    total = sum(unknown_on.values())
    out = {n: int(short - (total - unknown_on.get(n, 0)) + _EPS) for n in nodes}
    return {n: k for n, k in out.items() if k > 0}


def could_be_admitted(
    quota: QuotaBook, project: str, gpu_type: str, amount: float, preemptible: bool = True
) -> bool:
    """Whether quota could ever admit ``amount`` of ``gpu_type`` for ``project``: within its
    nominal, or, for a preemptible run in a cohort, within nominal plus borrowing limit (only
    a preemptible run borrows)."""
    q = quota.quota(project, gpu_type)
    if amount <= q.nominal + _EPS:
        return True
    if not preemptible or quota.root.get(project) is None:
        return False
    return q.borrowing_limit is None or amount <= q.nominal + q.borrowing_limit + _EPS


def quota_time(
    now: float, short: float, ends: Iterable[tuple[float | None, float]]
) -> tuple[float, float]:
    """When the project's own runs (``ends``: (expected end or None, GPUs)) have released
    ``short`` GPUs (``now`` when nothing is short; ``math.inf`` when runs with a known end never
    release enough), and the GPUs released by known ends."""
    if short <= _EPS:
        return now, 0.0
    freed = 0.0
    for end, amount in sorted((e, a) for e, a in ends if e is not None):
        freed += amount
        if freed >= short - _EPS:
            return end, freed
    return math.inf, freed


def timelines(snap: Snapshot) -> dict[str, list[tuple[float, int]]]:
    """Each node's timeline: (expected end, whole GPUs released) of its active runs with a
    known end (runs being preempted hold nothing), sorted; a node with none maps to []."""
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for a in snap.active:
        if a.placement is None or a.preempt_requested:
            continue
        end = expected_end(snap, a)
        if end is None:
            continue
        for slot in a.placement.slots:
            if slot.fraction >= 1.0 and slot.memory_mb is None:
                out[slot.node].append((end, len(slot.devices)))
    for v in out.values():
        v.sort()
    return out


#: per GPU type: (the quota the anchor counts on (None: none), the project's usage now, the
#: (expected end or None, GPUs) of each of its own runs on that type)
QuotaOf = Callable[[str], tuple[float | None, float, list[tuple[float | None, float]]]]


def reserve(
    snap: Snapshot,
    cap: Capacity,
    run: Run,
    gpu_types: list[str],
    lines: Mapping[str, list[tuple[float, int]]],
    quota_of: QuotaOf | None = None,
) -> Reservation | None:
    """The earliest reservation for a whole-GPU run (None: not whole GPUs, or no node set can
    ever host it). ``lines``: the nodes' timelines (``timelines`` of the active runs);
    ``quota_of`` gives the quota to hold per type (none without it).

    Per type, the node set needing the fewest GPUs from runs of unknown end, then the earliest;
    across types, the earliest time (devices and quota), then the fewest such GPUs."""
    req = run.request
    if req.shape != "whole":
        return None
    now = snap.now

    def walk(name: str, free: int, need: int) -> tuple[int, float]:
        return reach_on(lines.get(name, ()), free, need, now)

    best: tuple[tuple[float, int], Reservation] | None = None
    for t in gpu_types:
        for chosen in _earliest_by_backend(snap, cap, run, t, walk):
            unknown = sum(k for k, _, _ in chosen)
            at = math.inf if unknown else chosen[-1][1]
            limit, used = None, 0.0
            ends: list[tuple[float | None, float]] = []
            if quota_of is not None:
                limit, used, ends = quota_of(t)
            at_q = snap.now
            if limit is not None:
                at_q, _ = quota_time(snap.now, used + req.gpus * req.nodes - limit, ends)
            at = max(at, at_q)
            if best is not None and (at, unknown) >= best[0]:
                continue
            released = sum(a for e, a in ends if e is not None and e <= at)
            best = (
                (at, unknown),
                Reservation(
                    run.id,
                    at,
                    req.gpus,
                    {name: list(lines.get(name, ())) for _, _, name in chosen},
                    run.project,
                    t,
                    float(req.gpus * req.nodes),
                    limit,
                    released,
                    tuple(name for k, _, name in chosen if k),
                    at_q == math.inf,
                ),
            )
    return None if best is None else best[1]


def _earliest_by_backend(
    snap: Snapshot,
    cap: Capacity,
    run: Run,
    gpu_type: str,
    walk: Callable[[str, int, int], tuple[int, float]],
) -> list[list[tuple[int, float, str]]]:
    """Per backend (in the order their nodes first fit), the ``nodes`` eligible nodes of
    ``gpu_type`` large enough for the run's GPUs per node that need the fewest GPUs released
    by runs of unknown end, then have them free first: (those GPUs, time, node), in that
    order (the time is when runs with a known end have released what they can)."""
    req = run.request
    by_backend: dict[str, list[tuple[int, float, str]]] = defaultdict(list)
    for node in eligible_nodes(snap, cap, run, gpu_type):
        if node.capacity < req.gpus:
            continue
        free, when = len(cap.free[node.name]), snap.now
        if free < req.gpus:
            free, when = walk(node.name, free, req.gpus)
        by_backend[node.backend].append((max(req.gpus - free, 0), when, node.name))
    return [sorted(c)[: req.nodes] for c in by_backend.values() if len(c) >= req.nodes]


def reach_on(
    line: Iterable[tuple[float, int]], free: int, need: int, now: float
) -> tuple[int, float]:
    """Walking a node's timeline (sorted (end, GPUs released)) from ``free`` GPUs free now:
    the GPUs free and the time once ``need`` are free, or all it ever frees and the last end
    when that is never enough (``free < need`` tells which)."""
    when = now
    for end, n in line:
        free, when = free + n, end
        if free >= need:
            break
    return free, when


@dataclass
class _TypeProfile:
    """GPUs of one type over time: ``free`` are free at ``at`` once the runs booked so far
    have their GPUs; ``ends[i:]`` are the (time, GPUs) releases still to come."""

    free: float
    at: float
    ends: list[tuple[float, float]] = field(default_factory=list)
    i: int = 0
    unknown: float = 0.0  # GPUs held by runs without a known end

    def eta(self, need: float) -> tuple[float, int, float] | None:
        """When ``need`` more GPUs are free (with the walk's position and the GPUs free
        then), or None when the known releases never free enough."""
        free, at, i = self.free, self.at, self.i
        while free < need - 1e-9:
            if i == len(self.ends):
                return None
            at, got = self.ends[i]
            free, i = free + got, i + 1
        return at, i, free

    def book(self, found: tuple[float, int, float], need: float, runtime: float | None) -> None:
        self.at, self.i, self.free = found[0], found[1], found[2] - need
        if runtime is not None:  # (after position i: every release before it is no later)
            insort(self.ends, (found[0] + runtime, need))


class EtaBook:
    """Estimated start times for pending runs visited in scheduling order."""

    def __init__(self, snap: Snapshot, cap: Capacity, admitted: Iterable[Run] = ()) -> None:
        """``admitted``: runs this cycle admitted (already booked in ``cap``), which hold GPUs
        from now on like the active runs."""
        self.now = snap.now
        self.profiles: dict[str, _TypeProfile] = {}
        releases: dict[str, list[tuple[float, float]]] = defaultdict(list)
        unknown: dict[str, float] = defaultdict(float)
        for a in (*snap.active, *admitted):
            if a.placement is None or a.preempt_requested:
                continue
            end = expected_end(snap, a)
            if end is None:
                unknown[a.placement.gpu_type] += a.placement.gpu_amount
            else:
                releases[a.placement.gpu_type].append((end, a.placement.gpu_amount))
        free: dict[str, float] = defaultdict(float)
        for n in cap.nodes.values():
            if n.schedulable:
                free[n.gpu_type] += len(cap.free[n.name])
        for t in set(free) | set(releases):
            self.profiles[t] = _TypeProfile(
                free[t], self.now, sorted(releases[t]), unknown=unknown[t]
            )

    def book(
        self, gpu_types: list[str], need: float, runtime: float | None = None
    ) -> tuple[float | None, str]:
        """ETA of a run needing ``need`` GPUs of any of ``gpu_types`` for ``runtime`` (its
        ``max_runtime``; None: unknown), queued behind the runs booked before it; and, when
        there is none, why."""
        best: tuple[tuple[float, int, float], str] | None = None
        held_unknown = 0.0
        for t in gpu_types:
            prof = self.profiles.get(t)
            if prof is None:
                continue
            found = prof.eta(need)
            held_unknown += prof.unknown
            if found is not None and (best is None or found[0] < best[0][0]):
                best = (found, t)
        if best is None:
            why = held_unknown_text(held_unknown) if held_unknown else NO_ETA["not_enough"]
            for t in gpu_types:  # still queue it, so runs behind it are not estimated too early
                if t in self.profiles:
                    self.profiles[t].free -= need
                    break
            return None, why
        self.profiles[best[1]].book(best[0], need, runtime)
        return best[0][0], "estimated from max_runtime of running runs"


def quota_eta(
    snap: Snapshot,
    used: float,
    limit: float | None,
    projects: Collection[str],
    gpu_type: str,
    need: float,
    admitted: Iterable[Run] = (),
    ends: list[tuple[float, float]] | None = None,
    cum: list[float] | None = None,
) -> tuple[float | None, str]:
    """When the runs of ``projects`` (a project, or every member of its cohort tree) on
    ``gpu_type``, holding ``used`` of quota ``limit``, will have released enough of it.
    ``ends``: their ``quota_ends``, and ``cum`` the GPUs released by each of them, when the
    caller keeps them."""
    if limit is None:
        return None, NO_ETA["cohort_lends"]
    short = used + need - limit
    if short <= 1e-9:
        return snap.now, ""
    if ends is None:
        ends = quota_ends(snap, projects, gpu_type, admitted)
    freed = list(accumulate(a for _, a in ends)) if cum is None else cum
    i = bisect_left(freed, short - 1e-9)
    if i < len(ends):
        return ends[i][0], ""
    return None, quota_unknown(next(iter(projects)) if len(projects) == 1 else None)


def quota_ends(
    snap: Snapshot, projects: Collection[str], gpu_type: str, admitted: Iterable[Run] = ()
) -> list[tuple[float, float]]:
    """(expected end, GPUs) of the runs of ``projects`` on ``gpu_type`` with a known end,
    soonest first."""
    ends: list[tuple[float, float]] = []
    for a in (*snap.active, *admitted):
        if (
            a.project in projects
            and a.placement is not None
            and a.placement.gpu_type == gpu_type
            and not a.preempt_requested
        ):
            end = expected_end(snap, a)
            if end is not None:
                ends.append((end, a.placement.gpu_amount))
    return sorted(ends)
