"""The default policy, one scheduling cycle as numbered steps (``decide``):

1. snapshot -> free devices, quota usage, shares (``Capacity``, ``QuotaBook``, ``Shares``);
2. triage: unknown project or class (invalid), backoff not over, budget spent with
   ``action: wait``; a spent budget with ``action: lower`` demotes the run's class instead;
3. order: priority class (high first); within a class, the project with the lowest weighted
   dominant share goes next (fair share, recomputed as the cycle admits); within a project,
   submit time (or least attained service under ``order: las``). Each class is served in two
   passes: first the runs within their project's nominal quota, then the runs that borrow,
   so that nothing borrows what its owner takes back at once;
4. fit: for each acceptable GPU type, best-fit placement (``placement.place``) that also
   respects the backfill reservation, and the project's quota (``QuotaBook.problem``);
5. preempt: a run that does not fit may get victims (``preempt.find_plan``); it is admitted
   in a later cycle, once they have exited;
6. reserve: the first run blocked by capacity gets an EASY reservation (``backfill.reserve``);
   runs behind it start only if they do not delay it;
7. explain: every run not admitted gets a reason code, a sentence and, where the runs it
   waits for have ``max_runtime``, an estimated start time (``backfill.EtaBook``).
Strict FIFO: once a project has a blocked run, its later runs wait behind it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable

from mlops_gpu.core.backfill import EtaBook, Reservation, expected_end, quota_eta, reserve
from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.decision import Admission, Decision, PendingReason, Preemption, ReasonCode
from mlops_gpu.core.fairshare import (
    Shares,
    attained_now,
    budget_exceeded,
    effective_priority,
    las_level,
)
from mlops_gpu.core.placement import could_ever_fit, place, request_amount
from mlops_gpu.core.preempt import find_plan
from mlops_gpu.core.quota import QuotaBook
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Placement, Run


def _shape(run: Run, gpu_types: list[str]) -> str:
    req = run.request
    types = " or ".join(gpu_types) if gpu_types else "GPUs (no type in this cluster)"
    if req.shape == "mig":
        return f"needs {req.gpus} MIG {req.mig} slice(s) of {types}"
    if req.shape == "shared":
        parts = [
            f"{req.gpu_fraction:g} of a GPU" if req.gpu_fraction else "",
            f"{req.gpu_memory_mb} MB" if req.gpu_memory_mb else "",
        ]
        return f"needs {' with '.join(p for p in parts if p)} of a shared {types}"
    where = "on one node" if req.nodes == 1 else f"on each of {req.nodes} nodes"
    return f"needs {req.gpus} {types} {where}"


class Cycle:
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.cap = Capacity(snap)  # 1. snapshot
        self.quota = QuotaBook(snap, self.cap.used)
        self.shares = Shares(snap, self.cap.used, self.cap.capacity_by_type)
        self.types = sorted({n.gpu_type for n in snap.nodes})
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.pending: dict[str, PendingReason] = {}
        self.going: set[str] = {a.id for a in snap.active if a.preempt_requested}
        self.reservation: Reservation | None = None
        self.blocked_projects: dict[str, str] = {}
        self.budget_notes = {p: budget_exceeded(snap, p) for p in snap.projects}
        self.prio: dict[str, int] = {}
        self.visit_order: list[Run] = []
        self.types_of: dict[str, list[str]] = {}

    # -- 2. triage ----------------------------------------------------------------------
    def _triage(self) -> list[Run]:
        snap, ready = self.snap, []
        for run in snap.pending:
            if run.project not in snap.projects or run.spec.priority not in snap.priority_classes:
                what = "project" if run.project not in snap.projects else "priority class"
                self._wait(run, ReasonCode.INVALID, f"unknown {what}")
                continue
            note = self.budget_notes.get(run.project)
            budget = snap.projects[run.project].budget
            if note is not None and budget is not None and budget.action == "wait":
                self._wait(
                    run, ReasonCode.BUDGET, f"{note}; it waits until the window frees budget"
                )
                continue
            if run.not_before is not None and run.not_before > snap.now:
                self._wait(
                    run,
                    ReasonCode.BACKOFF,
                    f"requeued as attempt {run.attempt}; backoff for "
                    f"{run.not_before - snap.now:.0f}s more",
                    eta=run.not_before,
                )
                continue
            self.prio[run.id] = effective_priority(snap, run, note)
            self.types_of[run.id] = [t for t in self.types if run.request.accepts(t)]
            ready.append(run)
        return ready

    # -- 3. order -----------------------------------------------------------------------
    def _within_project_key(self, run: Run) -> tuple[int, float, int]:
        level = las_level(self.snap, run.attained_gpu_s) if self.snap.policy.order == "las" else 0
        return (level, run.submitted_at, run.seq)

    def run(self) -> Decision:
        ready = self._triage()
        levels: dict[int, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
        for run in ready:
            levels[self.prio[run.id]][run.project].append(run)
        for level in sorted(levels, reverse=True):
            queues = levels[level]
            for q in queues.values():
                q.sort(key=self._within_project_key)
            deferred: dict[str, list[Run]] = defaultdict(list)
            self._level(queues, deferred)  # runs within nominal quota
            self._level(deferred, None)  # then the runs that borrow
        self._explain()  # 7. explain
        return Decision(
            tuple(self.admissions),
            tuple(self.preemptions),
            tuple(self.pending[r.id] for r in self.snap.pending if r.id in self.pending),
        )

    def _level(self, queues: dict[str, list[Run]], defer: dict[str, list[Run]] | None) -> None:
        """Serve one priority class in fair-share order. With ``defer``, runs that would have to
        borrow are set aside there (with the rest of their project's queue under strict FIFO)
        for a second call, so that nothing borrows what its owner takes back at once."""
        heap = [(self.shares.share(p), p, 0) for p, q in queues.items() if q]
        heapq.heapify(heap)
        while heap:
            _, project, i = heapq.heappop(heap)
            q = queues[project]
            if project in self.blocked_projects:  # strict FIFO
                head = self.blocked_projects[project]
                for run in q[i:]:
                    self._wait(
                        run,
                        ReasonCode.QUEUED_BEHIND,
                        f"queued behind run {head} (strict FIFO in project {project})",
                    )
                continue
            run = q[i]
            if defer is not None and self._must_borrow(run):
                if self.snap.policy.queueing == "strict-fifo":
                    defer[project].extend(q[i:])
                    continue
                defer[project].append(run)
            else:
                self.visit_order.append(run)
                if not self._try(run) and self.snap.policy.queueing == "strict-fifo":
                    self.blocked_projects[project] = run.id
            if i + 1 < len(q):
                heapq.heappush(heap, (self.shares.share(project), project, i + 1))

    def _must_borrow(self, run: Run) -> bool:
        amount = request_amount(run)
        return not any(
            self.quota.within_nominal(run.project, t, amount) for t in self.types_of[run.id]
        )

    # -- 4. fit, 5. preempt, 6. reserve -------------------------------------------------
    def _backfill_filter(self, run: Run) -> Callable[..., bool] | None:
        res = self.reservation
        if res is None:
            return None
        ends = None
        if run.spec.max_runtime_s is not None:
            ends = self.snap.now + run.spec.max_runtime_s
        return lambda node, free_after: res.allows(node, free_after, ends)

    def _try(self, run: Run) -> bool:
        types = self.types_of[run.id]
        quota_msgs: list[str] = []
        fits_without_reservation = False
        flt = self._backfill_filter(run)
        for t in types:
            placement = place(self.snap, self.cap, run, t, flt)
            if placement is None and flt is not None:
                fits_without_reservation |= place(self.snap, self.cap, run, t) is not None
            amount = placement.gpu_amount if placement else request_amount(run)
            problem = self.quota.problem(run.project, t, amount)
            if problem is not None:
                quota_msgs.append(problem)
                continue
            if placement is not None:
                self._admit(run, placement)
                return True
        # A run that fits but for the reservation waits for it; it does not preempt.
        if (
            not fits_without_reservation
            and self.snap.policy.preemption
            and self._preempt(run, types)
        ):
            return False
        if len(quota_msgs) == len(types) and types:
            self._wait(run, ReasonCode.QUOTA, f"{_shape(run, types)}; " + "; ".join(quota_msgs))
            return False
        if fits_without_reservation and self.reservation is not None:
            res = self.reservation
            self._wait(
                run,
                ReasonCode.RESERVED,
                f"{_shape(run, types)}; free GPUs are held for run {res.run_id}, "
                f"reserved to start by {res.at:.0f} (epoch s), and this run "
                "would not end before then (set max_runtime to backfill)",
            )
            return False
        if self.snap.policy.backfill and self.reservation is None:
            self.reservation = reserve(self.snap, self.cap, run, types)
        self._wait_capacity(run, types)
        return False

    def _admit(self, run: Run, placement: Placement) -> None:
        self.cap.take(run.project, placement)
        self.shares.add(run.project, placement.gpu_type, placement.gpu_amount)
        self.admissions.append(Admission(run.id, placement))

    def _may_preempt(self, run: Run, victim: Run) -> bool:
        if victim.id in self.going:
            return False
        snap = self.snap
        if victim.project == run.project:
            mine, theirs = self.prio[run.id], snap.priority_of(victim)
            if theirs < mine:
                return True
            return (
                snap.policy.order == "las"
                and theirs == mine
                and las_level(snap, attained_now(snap, victim))
                > las_level(snap, run.attained_gpu_s)
            )
        t = victim.placement.gpu_type if victim.placement else ""
        return (
            self.quota.root.get(victim.project) is not None
            and self.quota.root.get(victim.project) == self.quota.root.get(run.project)
            and self.quota.borrowed(victim.project, t) > 0
            and self.quota.within_nominal(run.project, t, request_amount(run))
        )

    def _preempt(self, run: Run, types: list[str]) -> bool:
        snap = self.snap
        plan = find_plan(snap, self.cap, self.quota, run, types, self._may_preempt, self.going)
        if plan is None:
            return False
        if not plan.victims:
            waiting = sorted(self.going)
            self._wait(
                run,
                ReasonCode.PREEMPTING,
                f"{_shape(run, types)}; waiting for preempted run(s) "
                f"{', '.join(waiting[:5])} to exit",
                eta=max(
                    (expected_end(snap, a) or snap.now for a in snap.active if a.id in self.going),
                    default=snap.now,
                ),
            )
            return True
        for v in plan.victims:
            self.going.add(v.id)
            why = (
                f"preempted for run {run.id} (priority {run.spec.priority})"
                if v.project == run.project
                else f"reclaimed: project {run.project} needs its nominal quota back; project "
                f"{v.project} was borrowing"
            )
            self.preemptions.append(
                Preemption(v.id, why, v.spec.checkpoint.signal, v.spec.checkpoint.grace_s, run.id)
            )
        names = ", ".join(v.id for v in plan.victims)
        grace = max(v.spec.checkpoint.grace_s for v in plan.victims)
        self._wait(
            run,
            ReasonCode.PREEMPTING,
            f"{_shape(run, types)}; preempting {len(plan.victims)} run(s) ({names}), "
            f"losing {plan.lost_gpu_s / 3600:.2f} GPU-hours since their checkpoints; "
            f"it starts once they exit (grace up to {grace:g}s)",
            eta=snap.now + grace,
        )
        return True

    # -- 7. explain ---------------------------------------------------------------------
    def _wait(self, run: Run, code: ReasonCode, reason: str, eta: float | None = None) -> None:
        self.pending[run.id] = PendingReason(run.id, code, reason, eta)

    def _wait_capacity(self, run: Run, types: list[str]) -> None:
        fits_ever = [t for t in types if could_ever_fit(self.snap, run, t)]
        if not fits_ever:
            self._wait(
                run,
                ReasonCode.UNSCHEDULABLE,
                f"{_shape(run, types)}; no node of this cluster can host it",
            )
            return
        blocks = ", ".join(f"{self.cap.largest_free_block(t)} {t}" for t in fits_ever)
        borrowed = [
            f"{b:g} {t} borrowed by project {p}"
            for t in fits_ever
            for p, b in sorted(self.quota.borrowers(run.project, t).items())
        ]
        extra = ""
        if borrowed and self.quota.within_nominal(run.project, fits_ever[0], request_amount(run)):
            extra = "; reclaimable: " + ", ".join(borrowed)
        elif borrowed:
            extra = "; " + ", ".join(borrowed)
        self._wait(
            run,
            ReasonCode.NO_CAPACITY,
            f"{_shape(run, types)}; the largest free block is {blocks}{extra}",
        )

    def _explain(self) -> None:
        """Add ETAs: the reservation's time for its run, the profile estimate for the rest."""
        etas = EtaBook(self.snap, self.cap)
        for run in self.visit_order:
            p = self.pending.get(run.id)
            if p is None:
                continue
            types = self.types_of[run.id]
            if p.reason_code in (ReasonCode.UNSCHEDULABLE, ReasonCode.INVALID):
                continue
            eta, why = etas.book(types, request_amount(run))
            if p.reason_code is ReasonCode.QUOTA:
                eta, why = self._quota_eta(run, types)
            if self.reservation is not None and self.reservation.run_id == run.id:
                eta, why = self.reservation.at, "reserved (EASY backfill)"
            if p.eta is not None:
                eta = max(p.eta, eta) if eta is not None else p.eta
            reason = p.reason if eta is not None else f"{p.reason}; {why}"
            self.pending[run.id] = PendingReason(run.id, p.reason_code, reason, eta)

    def _quota_eta(self, run: Run, types: list[str]) -> tuple[float | None, str]:
        best: tuple[float | None, str] = (None, "no ETA")
        for t in types:
            q = self.quota.quota(run.project, t)
            limit = None if q.borrowing_limit is None else float(q.nominal + q.borrowing_limit)
            if self.quota.root.get(run.project) is None:
                limit = float(q.nominal)
            eta, why = quota_eta(
                self.snap,
                self.quota.used[(run.project, t)],
                limit,
                run.project,
                t,
                request_amount(run),
            )
            if eta is not None and (best[0] is None or eta < best[0]):
                best = (eta, why)
            elif best[0] is None:
                best = (None, why)
        return best


def decide_default(snap: Snapshot) -> Decision:
    return Cycle(snap).run()


POLICIES: dict[str, Callable[[Snapshot], Decision]] = {"default": decide_default}


def decide(snap: Snapshot) -> Decision:
    """The scheduling decision for ``snap`` under the policy it names."""
    return POLICIES[snap.policy.name](snap)


def explain_all(snap: Snapshot) -> tuple[PendingReason, ...]:
    """A reason (and ETA where one can be computed) for every pending run of ``snap``."""
    return decide(snap).pending
