"""The anchor of the EASY reservation (step 6 of ``policy``): which queued run the reservation
is for, and which run an engine keeps as the anchor for its next cycle.

The anchor is chosen by age, not by the order of visits, from the state as the cycle begins
(``anchor``): the run of the highest class that has waited longest among the whole-GPU runs
that could ever be admitted and are blocked now, or the run the last applied cycle kept. The
anchor kept for the next cycle, when the cycle had none or admitted it, is the oldest run the
cycle overtook (``overtaken``), read from its admissions.

Invariant: both read only the cycle's starting state (the queues, the free whole devices) and
its admissions, so the Python reference and the Rust engine, which
keeps its state between cycles, name the same anchor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlops_gpu.core.backfill import could_be_admitted
from mlops_gpu.core.placement import free_counts, place, request_amount
from mlops_gpu.core.queue_keys import Age, age_of, shape_key
from mlops_gpu.model import Run

if TYPE_CHECKING:
    from mlops_gpu.core.cycle_books import CycleBooks


def node_sets(c: CycleBooks, gpu_type: str, gpus: int, nodes: int, backend: str | None) -> bool:
    """Whether one backend has ``nodes`` nodes of ``gpu_type`` with ``gpus`` free each now
    (host resources not checked)."""
    counts = free_counts(c.snap, c.cap, gpu_type, backend, nodes, gpus)
    return any(k >= nodes for k in counts.values())


def anchor(c: CycleBooks) -> tuple[Run, list[str]] | None:
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
    (submit time, seq, run id). It is read from the cycle's starting state.

    Runs of one queue are interchangeable for placement and quota, so each queue is judged by
    its oldest run (highest class and oldest first: the first blocked one has the anchor)."""
    st = c.state
    best: tuple[tuple[int, Age], Run, list[str]] | None = None
    kept = st.pending.get(st.anchor) if st.anchor is not None else None
    if kept is not None and kept.id in st.order_keys:
        sk = shape_key(st.template, kept)
        level = c.level_of(kept.project, int(sk[0]))  # type: ignore[call-overload]
        types = _types(c, kept) if level is not None else []
        if types:
            best = ((-level, age_of(kept)), kept, types)  # type: ignore[operator]
    # each queue judged by its oldest run, highest class (after budgets) and oldest first
    heads: list[tuple[tuple[int, Age], Run]] = []
    for project, subqueues in st.queues.items():
        for sk, q in subqueues.items():
            level = c.level_of(project, int(sk[0]))  # type: ignore[call-overload]
            if q and level is not None:
                oldest = min(q, key=age_of)
                heads.append(((-level, age_of(oldest)), oldest))
    heads.sort(key=lambda h: h[0])  # (ages name runs: no two keys tie)
    for key, oldest in heads:
        if best is not None and key >= best[0]:
            break
        found = _blocked(c, oldest)
        if found is not None:
            best = (key, *found)
            break
    return None if best is None else (best[1], best[2])


def overtaken(c: CycleBooks) -> str | None:
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
        level = c.level_of(run.project, c.snap.priority_of(run))
        age = age_of(run)
        if level is not None and (level not in youngest or youngest[level] < age):
            youngest[level] = age
    best: tuple[tuple[int, Age], str] | None = None
    for project, subqueues in st.queues.items():
        for sk, q in subqueues.items():
            level = c.level_of(project, int(sk[0]))  # type: ignore[call-overload]
            if not q or level not in youngest:
                continue
            for age in sorted(map(age_of, q)):  # its oldest run not admitted
                if age >= youngest[level] or (best is not None and (-level, age) >= best[0]):
                    break
                if age[2] in admitted:
                    continue
                if _types(c, st.pending[age[2]]):
                    best = ((-level, age), age[2])
                break
    return None if best is None else best[1]


def _types(c: CycleBooks, run: Run) -> list[str]:
    """The GPU types a whole-GPU run could ever be admitted on (an empty cluster hosts it, its
    quota could admit it); [] for other shapes."""
    if run.request.shape != "whole":
        return []
    amount = request_amount(run)
    pre = run.spec.preemptible
    return [
        t for t in c.state.ever_fits(run) if could_be_admitted(c.quota, run.project, t, amount, pre)
    ]


def _blocked(c: CycleBooks, run: Run) -> tuple[Run, list[str]] | None:
    """A queue's oldest run with ``_types``, if it is blocked now: on none of them do both
    quota admit it and a node set take it; else None."""
    project = run.project
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
