"""The parking lot: which queues a cycle must visit, and which run holds the reservation,
without judging every queue head in every cycle.

Queues are skipped (``candidates``) only with fair share (``Cycle``): there a project's turn
comes by its share, whatever queues it visits; without fair share it comes by the project's
oldest queue head, which may be a parked one. The anchor serves every cycle.

A queue is *parked* for a cycle when, as the cycle begins, it is surely blocked: on each
acceptable GPU type its project has no room in quota for the request (``Cycle.room``) or the
free-count index has no node set that could take it, and no active run could be its victim.
Parked queues are not visited. This is exact, not a heuristic, because within one cycle
- free capacity only shrinks (admissions take GPUs; preemption trials give back what they took),
- quota room only shrinks (usage only grows; an exhausted cohort stays exhausted), and
- the victim pools do not change (they are read from the state as the cycle began),
so a queue surely blocked at the start is surely blocked at its turn, where a visit would have
done nothing. ``candidates`` may return more than it must (over-approximations are judged at
their turn as before), never less.

The anchor of the EASY reservation is chosen by age, not by the order of visits, from the state
as the cycle begins (``anchor``): so a full visit and a parked visit reserve for the same run.
The anchor kept for the next cycle, when the cycle had none or admitted it, is the oldest run
the cycle overtook (``overtaken``), read from its admissions: the same for both visits too.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import TYPE_CHECKING

from mlops_gpu.core import borrowers
from mlops_gpu.core.backfill import could_be_admitted
from mlops_gpu.core.placement import indexed_buckets, place, request_amount
from mlops_gpu.core.queue_keys import Age, ShapeKey, Signature, age_of, shape_key
from mlops_gpu.model import Run

if TYPE_CHECKING:
    from mlops_gpu.core.cycle_victims import VictimRules

_EPS = 1e-9


def node_sets(c: VictimRules, gpu_type: str, gpus: int, nodes: int, backend: str | None) -> bool:
    """Whether one backend has ``nodes`` nodes of ``gpu_type`` with ``gpus`` free each now
    (the free-count index; the same eligibility as ``placement._place_whole_indexed``).
    Remembered until the cycle admits a run (only admissions change free capacity)."""
    key = (gpu_type, gpus, nodes, backend)
    seen = c.fit_memo.get(key)
    if seen is not None and seen[0] == len(c.admissions):
        return seen[1]
    found = _node_sets(c, gpu_type, gpus, nodes, backend)
    c.fit_memo[key] = (len(c.admissions), found)
    return found


def _node_sets(c: VictimRules, gpu_type: str, gpus: int, nodes: int, backend: str | None) -> bool:
    return any(
        c.cap.count_at_least((gpu_type, b), gpus) >= nodes
        for b, _ in indexed_buckets(c.snap, c.cap, gpu_type, backend, nodes)
    )


#: per GPU type: (lowest class among the project's own possible victims, the latest expected
#: end of any of them at that class (``State.longest_to_go`` before subtracting the clock), the
#: most the project could add within nominal while a cohort member that borrowed the type at
#: the start has preemptible runs)
Hope = dict[str, tuple[int | None, float, float]]


def _hope(c: VictimRules, project: str) -> Hope:
    """``Hope`` of ``project``: what ``Cycle._victims_possible`` looks at, as the cycle begins.

    Kept between cycles (``State.hopes``): it reads only the victim pools, their expected ends
    and the usage of the project's cohort tree (whose borrowing decides the lenders), and
    ``State.hope_stale`` names every project whose usage or pool changed since; their whole
    trees are worked out again (``_forget_stale_hopes``). The clock is applied at each use."""
    st = c.state
    found = st.hopes.get(project)
    if found is not None:
        return found
    quota = c.quota
    owner = quota.root.get(project)
    out: Hope = {}
    for t in st.types:
        pool = st.victims.get((project, t))
        lowest = min(pool) if pool else None
        end = None if lowest is None else st.latest_victim_end(project, t, lowest)
        reclaim = -1.0
        if owner is not None and any(
            m != project and st.victims.get((m, t)) for m in c.lenders_at_start(owner, t)
        ):
            reclaim = quota.quota(project, t).nominal - quota.used[(project, t)]
        if lowest is not None or reclaim >= 0 or borrowers.enabled(c):
            out[t] = (lowest, -1.0 if end is None else end, reclaim)
    st.hopes[project] = out
    return out


def _forget_stale_hopes(c: VictimRules) -> None:
    """Drop the kept hopes of every cohort tree with a member in ``State.hope_stale``: a
    member's usage decides whether it lends (and so every member's reclaim), its pool every
    member's possible victims."""
    st, quota = c.state, c.quota
    for project in st.hope_stale:
        root = quota.root.get(project)
        for m in quota.members[root] if root is not None else (project,):
            st.hopes.pop(m, None)
    st.hope_stale.clear()


def _may_have_victims(
    c: VictimRules, hope: Hope, head: Run, cls: int, types: tuple[str, ...], amount: float
) -> bool:
    """What ``Cycle._victims_possible`` would say for the queue's head (under ``shortest``
    the head has the smallest max_runtime of its queue, so no run behind it has more hope).
    Peers of its class are judged by ``Cycle.peers_going_on``, from the hope's time to go."""
    now = c.snap.now
    for t in types:
        h = hope.get(t)
        if h is None:
            continue
        lowest, end, reclaim = h
        if lowest is not None and (
            lowest < cls or (lowest == cls and c.peers_going_on(head, max(end - now, 0.0)))
        ):
            return True
        if amount <= reclaim + _EPS:
            return True
        if borrowers.hoped(c, head.project, head, cls, t):
            return True
    return False


def candidates(c: VictimRules) -> dict[str, list[ShapeKey]]:
    """project -> the shape keys of its queues that are not surely blocked now.

    Kept between cycles (``State.lot_live``): a (signature, project) pair with no queue that
    could run is looked at again only when something that could unblock it has happened since
    (``_to_judge``); the pairs that had one are judged again every cycle."""
    st = c.state
    out: dict[str, list[ShapeKey]] = defaultdict(list)
    for project, sks in st.other_queues.items():
        out[project].extend(sks)
    preemption = c.snap.policy.preemption
    _forget_stale_hopes(c)
    rooms: dict[tuple[str, str], float] = {}  # ``Cycle.room``: fixed until the first admission
    live: set[tuple[Signature, str]] = set()
    for sig, projects in _to_judge(c).items():
        types, gpus, nodes, _ = sig
        by_project = st.by_signature[sig]
        amount = float(gpus * nodes)
        fit = st.lot_fit[sig]
        for project in projects:
            if project not in by_project:
                continue
            sks = by_project[project]
            if fit and _room_on_any(c, rooms, project, fit, amount):
                out[project].extend(sks)
                live.add((sig, project))
                continue
            if not preemption:
                continue
            hope = _hope(c, project)
            if hope:
                queues = st.queues[project]
                for sk in sks:
                    cls = int(sk[0])  # type: ignore[call-overload]
                    if _may_have_victims(c, hope, queues[sk][0], cls, types, amount):
                        out[project].append(sk)
                        live.add((sig, project))
    st.lot_live = live
    return out


def _to_judge(c: VictimRules) -> dict[Signature, set[str]]:
    """signature -> the projects whose queues of it may not be surely blocked now: every
    project of a signature that gained a fitting type since the last cycle; those whose usage
    or victims on one of its types changed, with every member of their cohort tree (lending
    and reclaiming tie their quota room and hope); those with a new queue head; and those
    that had a queue not surely blocked in the last cycle. Every other pair was surely
    blocked then and nothing has changed that could unblock it: free capacity of its types
    did not reach a node set (the fitting types are compared), its members' usage and victims
    did not change, its heads are the same, and the time to go of its victims only shrinks."""
    st = c.state
    out: dict[Signature, set[str]] = {}
    by_type: dict[str, list[Signature]] = defaultdict(list)
    for sig, by_project in st.by_signature.items():
        types, gpus, nodes, backend = sig
        fit = [t for t in types if node_sets(c, t, gpus, nodes, backend)]
        before = st.lot_fit.get(sig)
        st.lot_fit[sig] = fit
        if before is None or any(t not in before for t in fit):
            out[sig] = set(by_project)
        for t in types:
            by_type[t].append(sig)
    quota = c.quota
    for project, t in st.touched:
        root = quota.root.get(project)
        members = quota.members[root] if root is not None else [project]
        for sig in by_type.get(t, ()):
            by_project = st.by_signature[sig]
            for m in members:
                if m in by_project:
                    out.setdefault(sig, set()).add(m)
    st.touched.clear()
    for sig, project in itertools.chain(st.new_heads, st.lot_live):
        if sig in st.by_signature:
            out.setdefault(sig, set()).add(project)
    st.new_heads.clear()
    return out


def _room_on_any(
    c: VictimRules,
    rooms: dict[tuple[str, str], float],
    project: str,
    types: list[str],
    amount: float,
) -> bool:
    for t in types:
        room = rooms.get((project, t))
        if room is None:
            room = rooms[(project, t)] = c.room(project, t)
        if amount <= room + _EPS:
            return True
    return False


def anchor(c: VictimRules) -> tuple[Run, list[str]] | None:
    """The run the EASY reservation is for, with the GPU types it could ever be admitted on, or
    None. Candidates are the queued whole-GPU runs that fit an empty cluster, whose quota could
    ever admit them (``backfill.could_be_admitted``), and that are blocked as the cycle begins
    (on no such type do both quota admit them and a node set take them now), plus the run that
    the last applied cycle kept (``State.anchor``: its anchor, or the oldest run it overtook,
    ``overtaken``) while it is one of
    the others but for being blocked: it keeps the reservation when what it waited for is
    free, else a run the order prefers (under ``shortest`` or ``las``, or of a project with a
    lower share) would take it, again and again. Among them, the one of the highest class
    (after a spent budget's ``lower``; not those it makes wait) that has waited longest
    (submit time, seq, run id). It is read from the cycle's starting state: the same for a
    full visit and a parked one.

    Runs of one queue are interchangeable for placement and quota, so each queue is judged by
    its oldest run (``State.oldest``, highest class and oldest first: the first blocked one
    has the anchor). When a spent budget moves a project's runs to another class (or makes
    them wait), every queue is judged instead."""
    st = c.state
    best: tuple[tuple[int, Age], Run, list[str]] | None = None
    kept = st.pending.get(st.anchor) if st.anchor is not None else None
    if kept is not None and kept.id in st.order_keys:
        sk = shape_key(st.template, kept)
        level = c._level_of(kept.project, int(sk[0]))  # type: ignore[call-overload]
        types = _types(c, kept) if level is not None else []
        if types:
            best = ((-level, age_of(kept)), kept, types)  # type: ignore[operator]
    if any(note is not None for note in c.notes.values()):
        for project, subqueues in st.queues.items():
            for sk, q in subqueues.items():
                level = c._level_of(project, int(sk[0]))  # type: ignore[call-overload]
                if not q or level is None:
                    continue
                key = (-level, st.ages[(project, sk)][0])
                if best is not None and key >= best[0]:
                    continue
                found = _blocked(c, project, sk)
                if found is not None:
                    best = (key, *found)
    else:
        for neg_class, age, project, sk in st.oldest:
            if best is not None and (neg_class, age) >= best[0]:
                break
            found = _blocked(c, project, sk)
            if found is not None:
                best = ((neg_class, age), *found)
                break
    return None if best is None else (best[1], best[2])


def overtaken(c: VictimRules) -> str | None:
    """The anchor an engine keeps after cycle ``c`` when ``c`` had none or admitted it: the run
    of the highest class that has waited longest (as ``anchor``) among the queued runs that
    could ever be admitted (``_types``) and that ``c`` overtook: it did not admit them while it
    admitted a later run (submit time, seq, id) of their class. Such a run was not blocked as
    the cycle began (else it would have been the anchor), so without this a run the order
    prefers could take what it needs before its turn, cycle after cycle. Read before the
    decision is applied (the admitted runs are still queued)."""
    st = c.state
    admitted = {a.run_id for a in c.admissions}
    youngest: dict[int, Age] = {}  # class -> the latest run it admitted
    for rid in admitted:
        run = st.pending[rid]
        level = c._level_of(run.project, c.snap.priority_of(run))
        age = age_of(run)
        if level is not None and (level not in youngest or youngest[level] < age):
            youngest[level] = age
    best: tuple[tuple[int, Age], str] | None = None
    for project, subqueues in st.queues.items():
        for sk, q in subqueues.items():
            level = c._level_of(project, int(sk[0]))  # type: ignore[call-overload]
            if not q or level not in youngest:
                continue
            for age in st.ages[(project, sk)]:  # its oldest run not admitted
                if age >= youngest[level] or (best is not None and (-level, age) >= best[0]):
                    break
                if age[2] in admitted:
                    continue
                if _types(c, st.pending[age[2]]):
                    best = ((-level, age), age[2])
                break
    return None if best is None else best[1]


def _types(c: VictimRules, run: Run) -> list[str]:
    """The GPU types a whole-GPU run could ever be admitted on (an empty cluster hosts it, its
    quota could admit it); [] for other shapes."""
    if run.request.shape != "whole":
        return []
    amount = request_amount(run)
    pre = run.spec.preemptible
    return [
        t for t in c.state.ever_fits(run) if could_be_admitted(c.quota, run.project, t, amount, pre)
    ]


def _blocked(c: VictimRules, project: str, sk: ShapeKey) -> tuple[Run, list[str]] | None:
    """The queue's oldest run with ``_types``, if it is blocked now: on none of them do both
    quota admit it and a node set take it; else None."""
    st = c.state
    run = st.pending[st.ages[(project, sk)][0][2]]
    types = _types(c, run)
    if not types:
        return None
    req, amount = run.request, request_amount(run)
    for t in types:
        if not c.quota.admits(project, t, amount, run.spec.preemptible):
            continue
        if req.topology_key is None:
            if node_sets(c, t, req.gpus, req.nodes, run.spec.backend):
                return None
        elif place(c.snap, c.cap, run, t) is not None:
            return None
    return run, types
