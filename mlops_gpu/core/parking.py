"""The parking lot: which queues a cycle must visit, and which run holds the reservation,
without judging every queue head in every cycle.

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

The anchor of the EASY reservation is chosen from the starting state too, by age, not by the
order of visits: the highest-class, oldest queue head that its quota would admit on some type
while no node set of those types can take it now. So a full visit and a parked visit reserve
for the same run.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from mlops_gpu.core.placement import indexed_buckets, place, request_amount
from mlops_gpu.core.state import ShapeKey
from mlops_gpu.model import Run

if TYPE_CHECKING:
    from mlops_gpu.core.policy import Cycle

_EPS = 1e-9


def node_sets(c: Cycle, gpu_type: str, gpus: int, nodes: int, backend: str | None) -> bool:
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


def _node_sets(c: Cycle, gpu_type: str, gpus: int, nodes: int, backend: str | None) -> bool:
    return any(
        c.cap.count_at_least((gpu_type, b), gpus) >= nodes
        for b, _ in indexed_buckets(c.snap, c.cap, gpu_type, backend, nodes)
    )


#: per GPU type: (lowest class among the project's own possible victims, the most time any of
#: them at that class is expected to go on for, the most the project could add within nominal
#: while a cohort member that borrowed the type at the start has preemptible runs)
Hope = dict[str, tuple[int | None, float, float]]


def _hopes(c: Cycle) -> dict[str, Hope]:
    """project -> ``Hope``: what ``Cycle._victims_possible`` looks at, read once a cycle."""
    st, quota, now = c.state, c.quota, c.snap.now
    lenders: dict[tuple[str, str], set[str]] = {}
    for root in quota.members:
        for t in st.types:
            lenders[(root, t)] = {m for m in c.lenders_at_start(root, t) if st.victims.get((m, t))}
    out: dict[str, Hope] = defaultdict(dict)
    for project in st.queues:
        owner = quota.root.get(project)
        for t in st.types:
            pool = st.victims.get((project, t))
            lowest = min(pool) if pool else None
            to_go = -1.0 if lowest is None else st.longest_to_go(project, t, lowest, now)
            others = lenders.get((owner, t), set()) - {project} if owner is not None else set()
            reclaim = quota.quota(project, t).nominal - quota.used[(project, t)] if others else -1.0
            if lowest is not None or reclaim >= 0:
                out[project][t] = (lowest, to_go, reclaim)
    return out


def _may_have_victims(
    c: Cycle, hope: Hope, head: Run, cls: int, types: tuple[str, ...], amount: float
) -> bool:
    """What ``Cycle._victims_possible`` would say for the queue's head (under ``shortest``
    the head has the smallest max_runtime of its queue, so no run behind it has more hope).
    Peers of its class are judged by ``Cycle.peers_going_on``, from the hope's time to go."""
    for t in types:
        h = hope.get(t)
        if h is None:
            continue
        lowest, to_go, reclaim = h
        if lowest is not None and (
            lowest < cls or (lowest == cls and c.peers_going_on(head, to_go))
        ):
            return True
        if amount <= reclaim + _EPS:
            return True
    return False


def candidates(c: Cycle) -> dict[str, list[ShapeKey]]:
    """project -> the shape keys of its queues that are not surely blocked now."""
    st = c.state
    out: dict[str, list[ShapeKey]] = defaultdict(list)
    for project, sks in st.other_queues.items():
        out[project].extend(sks)
    hopes = _hopes(c) if c.snap.policy.preemption else {}
    rooms: dict[tuple[str, str], float] = {}  # ``Cycle.room``: fixed until the first admission
    for (types, gpus, nodes, backend), by_project in st.by_signature.items():
        amount = float(gpus * nodes)
        fit = [t for t in types if node_sets(c, t, gpus, nodes, backend)]
        for project, sks in by_project.items():
            if fit and _room_on_any(c, rooms, project, fit, amount):
                out[project].extend(sks)
                continue
            hope = hopes.get(project)
            if hope:
                queues = st.queues[project]
                for sk in sks:
                    cls = int(sk[0])  # type: ignore[call-overload]
                    if _may_have_victims(c, hope, queues[sk][0], cls, types, amount):
                        out[project].append(sk)
    return out


def _room_on_any(
    c: Cycle, rooms: dict[tuple[str, str], float], project: str, types: list[str], amount: float
) -> bool:
    for t in types:
        room = rooms.get((project, t))
        if room is None:
            room = rooms[(project, t)] = c.room(project, t)
        if amount <= room + _EPS:
            return True
    return False


def anchor(c: Cycle) -> tuple[Run, list[str]] | None:
    """The run the EASY reservation is for, with the GPU types its quota would admit it on, or
    None: the highest-class, oldest queue head blocked by capacity alone."""
    st = c.state
    best: tuple[tuple[int, tuple[int, float, int]], Run, list[str]] | None = None
    for project, subqueues in st.queues.items():
        rooms = {t: c.room(project, t) for t in st.types}
        if all(r < 1.0 - _EPS for r in rooms.values()):
            continue  # no whole-GPU request of this project has room in quota
        for sk, q in subqueues.items():
            level = c._level_of(project, int(sk[0]))  # type: ignore[call-overload]
            if not q or level is None:
                continue
            run = q[0]
            key = (-level, st.order_keys[run.id])
            if best is not None and key >= best[0]:
                continue
            types = _blocked_by_capacity(c, run, rooms)
            if types:
                best = (key, run, types)
    return None if best is None else (best[1], best[2])


def _blocked_by_capacity(c: Cycle, run: Run, rooms: dict[str, float]) -> list[str]:
    """The types on which quota would admit the whole-GPU ``run``, if it fits on none of them
    now; else []. ``rooms`` (``Cycle.room`` per type) rules types out before the exact quota
    check, which is only made where it decides something."""
    req = run.request
    if req.shape != "whole":
        return []
    amount = request_amount(run)
    types = [t for t in c.state.types_of(run) if amount <= rooms[t] + _EPS]
    admitted: list[str] = []
    for t in types:
        if req.topology_key is None:
            fits = node_sets(c, t, req.gpus, req.nodes, run.spec.backend)
        else:
            fits = place(c.snap, c.cap, run, t) is not None
        if c.quota.admits(run.project, t, amount):
            if fits:
                return []
            admitted.append(t)
    return admitted
