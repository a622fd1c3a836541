"""``explain``: the reason code, sentence and ETA of every run a cycle left pending (step 7
of ``policy``); the sentences come from ``reason_text``.

Invariants:
- ``explain`` changes no decision: it reads the cycle's books after ``cycle.schedule`` (a run judged
  lazily, ``CycleBooks.lazy``, is diagnosed here without side effects).
- Every pending run not admitted gets exactly one reason: invalid, backoff, budget, its own
  (met by the cycle), its queue head's (followers share it), or queued behind a blocked run
  (strict FIFO, booked in queue order so that a state kept by events and one built from a
  snapshot explain alike).
- An ETA is the reservation's time for its run when that is no earlier than the estimate
  (``backfill.EtaBook``), never earlier than the reason's own ETA (a backoff's end), and is
  None (with a sentence saying why) when the runs waited for have no ``max_runtime``.
- The victims the cycle chose hold nothing in the explanation's snapshot (``_with_active``
  marks them as being preempted).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace
from itertools import accumulate

from mlops_gpu.core import reason_text as rt
from mlops_gpu.core.backfill import EtaBook, Reservation, quota_ends, quota_eta
from mlops_gpu.core.cycle_books import CycleBooks, QuotaTerm
from mlops_gpu.core.decision import PendingReason, ReasonCode
from mlops_gpu.core.explain import shape_text
from mlops_gpu.core.lent import Held
from mlops_gpu.core.placement import request_amount
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Run


def wait_capacity(c: CycleBooks, run: Run, types: list[str]) -> None:
    fits_ever = c.state.ever_fits(run)
    if not fits_ever:
        c.wait(run, ReasonCode.UNSCHEDULABLE, rt.unschedulable(shape_text(run, types)))
        return
    blocks = [(t, c.cap.largest_free_block(t)) for t in fits_ever]
    borrowed = [
        (t, p, b) for t in fits_ever for p, b in sorted(c.quota.borrowers(run.project, t).items())
    ]
    lent = None
    if borrowed and c.quota.within_nominal(run.project, fits_ever[0], request_amount(run)):
        # which runs hold what it lent, whether they can be reclaimed, and their ends
        held = Held(c.snap, c.state.active.values(), c.going)
        lent = [held.runs(p, t) for t, p, _ in borrowed]
    text = rt.no_capacity(shape_text(run, types), blocks, borrowed, lent)
    c.wait(run, ReasonCode.NO_CAPACITY, text)


def with_active(c: CycleBooks) -> Snapshot:
    """The cycle's snapshot with the state's active runs (the ETAs read their ends); the
    victims this cycle chose are marked as being preempted (they hold nothing now)."""
    if c.full_snap is None:
        chosen = {p.run_id for p in c.preemptions}
        active = tuple(
            replace(a, preempt_requested=True) if a.id in chosen else a
            for a in c.state.active.values()
        )
        c.full_snap = replace(c.snap, active=active)
    return c.full_snap


def explain(c: CycleBooks) -> list[PendingReason]:
    """A reason for every pending run not admitted, with ETAs: the reservation's time
    for its run, the profile estimate (``EtaBook``) for the rest, in the order met."""
    snap, st = with_active(c), c.state
    out: dict[str, PendingReason] = {}
    for rid, why in st.invalid.items():
        out[rid] = PendingReason(rid, ReasonCode.INVALID, why)
    for run in st.backoff:
        out[run.id] = PendingReason(
            run.id,
            ReasonCode.BACKOFF,
            f"requeued as attempt {run.attempt}; backoff for "
            f"{(run.not_before or snap.now) - snap.now:.0f}s more",
            run.not_before,
        )
    for project, subqueues in st.queues.items():
        note = c.notes.get(project)
        budget = snap.projects[project].budget if project in snap.projects else None
        if note is not None and budget is not None and budget.action == "wait":
            for q in subqueues.values():
                for run in q:
                    out[run.id] = PendingReason(
                        run.id,
                        ReasonCode.BUDGET,
                        f"{note}; it waits until the window frees budget",
                    )
    admitted = {a.run_id for a in c.admissions}
    now_running = [
        replace(
            st.pending[a.run_id],
            placement=a.placement,
            admitted_at=snap.now,
            started_at=snap.now,
        )
        for a in c.admissions
    ]
    etas = EtaBook(snap, c.cap, now_running)
    #: (project, type, preemptible) -> ``_quota_term``: worked out once for the whole pass
    terms: dict[tuple[str, str, bool], QuotaTerm] = {}
    c.running_now = now_running

    def booked(run: Run, p: PendingReason) -> PendingReason:
        types = st.types_of(run)
        if p.reason_code in (ReasonCode.UNSCHEDULABLE, ReasonCode.INVALID):
            return p
        eta, why = etas.book(types, request_amount(run), run.spec.max_runtime_s)
        if p.reason_code is ReasonCode.QUOTA:  # it needs the GPUs and the quota
            at, why = _quota_eta(c, run, types, terms)
            eta = max(at, eta) if at is not None and eta is not None else at
        res = c.reservation
        if res is not None and res.run_id == run.id:
            # The reservation's time is a bound it keeps; the estimate may be earlier
            # (e.g. its cohort lends before its own project's runs end).
            if math.isfinite(res.at):
                if eta is None or eta >= res.at:
                    eta, why = res.at, "reserved (EASY backfill)"
            elif eta is None:
                why = _unknown_why(c, res)
        if p.eta is not None:
            eta = max(p.eta, eta) if eta is not None else p.eta
        return PendingReason(
            run.id, p.reason_code, p.reason if eta is not None else f"{p.reason}; {why}", eta
        )

    for run, followers in c.met:
        if run.id in c.lazy:
            _diagnose(c, run)
        p = c.reasons.get(run.id)
        if p is None or run.id in admitted:
            continue
        out[run.id] = booked(run, p)
        if followers is not None:
            project, sk, start, end = followers
            for f in st.queues[project][sk][start:end]:
                out[f.id] = booked(f, PendingReason(f.id, p.reason_code, p.reason))
    # Strict FIFO's followers are held subqueue by subqueue; they are booked in their
    # queue's order (a subqueue's place among its project's is no order at all, and
    # differs between a state kept by events and one built from a snapshot).
    held = [
        (f, project, head)
        for project, head, sk, start, end in c.behind
        for f in st.queues[project][sk][start:end]
    ]
    held.sort(key=lambda h: st.order_keys[h[0].id])
    for f, project, head in held:
        out[f.id] = booked(
            f,
            PendingReason(
                f.id,
                ReasonCode.QUEUED_BEHIND,
                rt.queued_behind(head, project),
            ),
        )
    return list(out.values())


def _unknown_why(c: CycleBooks, res: Reservation) -> str:
    """Why a reservation's time is unknown: the runs it waits for that have no
    max_runtime (on its nodes, and its project's own runs holding the quota it needs)."""
    nodes = set(res.unknown_nodes)
    names = sorted(
        a.id
        for a in c.state.active.values()
        if a.placement is not None
        and a.id not in c.state.going
        and a.spec.max_runtime_s is None
        and (
            any(n in nodes for n in a.placement.node_names)
            or (
                res.quota_unknown
                and a.project == res.project
                and a.placement.gpu_type == res.gpu_type
            )
        )
    )
    return rt.reserved_unknown(names, len(names))


def _quota_eta(
    c: CycleBooks, run: Run, types: list[str], terms: dict[tuple[str, str, bool], QuotaTerm]
) -> tuple[float | None, str]:
    best: tuple[float | None, str] = (None, rt.NO_ETA["plain"])
    for t in types:
        key = (run.project, t, run.spec.preemptible)
        if key not in terms:  # (the same for every run of the explanation: nothing moves)
            terms[key] = _quota_term(c, *key)
        holders, used, limit, ends, cum = terms[key]
        eta, why = quota_eta(
            with_active(c), used, limit, holders, t, request_amount(run), (), ends, cum
        )
        if eta is not None and (best[0] is None or eta < best[0]):
            best = (eta, why)
        elif best[0] is None:
            best = (None, why)
    return best


def _quota_term(c: CycleBooks, project: str, t: str, preemptible: bool = True) -> QuotaTerm:
    """Whose runs hold the quota a run of ``project`` waits for on ``t``, what they hold,
    its limit (None: unknown), their runs' ends (``quota_ends``) and the GPUs released by
    each. A run that is not preemptible waits for its project's nominal quota alone (only
    a preemptible run borrows)."""
    book = c.quota
    q = book.quota(project, t)
    limit = None if q.borrowing_limit is None else float(q.nominal + q.borrowing_limit)
    holders: Collection[str] = (project,)
    root = book.root.get(project)
    if root is None or not preemptible:
        limit = float(q.nominal)
    elif limit is None and all(book.quota(m, t).lending_limit is None for m in book.members[root]):
        # Without lending limits, a borrower is admitted once the tree's members hold no
        # more than their nominal quotas together (``QuotaBook.admits``).
        holders = book.members[root]
        limit = float(sum(book.quota(m, t).nominal for m in holders))
    used = sum(book.used[(m, t)] for m in holders)
    ends = quota_ends(with_active(c), holders, t, c.running_now)
    return holders, used, limit, ends, list(accumulate(a for _, a in ends))


def _diagnose(c: CycleBooks, run: Run) -> None:
    """The reason of a run judged by ``_surely_blocked``, without side effects: it cannot
    be placed, so what remains is which limit to name."""
    types = c.state.types_of(run)
    amount = request_amount(run)
    pre = run.spec.preemptible
    quota_msgs = [m for t in types if (m := c.quota.problem(run.project, t, amount, pre))]
    if quota_msgs and len(quota_msgs) == len(types):
        c.wait(run, ReasonCode.QUOTA, rt.over_quota(shape_text(run, types), quota_msgs))
    else:
        wait_capacity(c, run, types)
