"""The default policy, one scheduling cycle as numbered steps (``decide``):

1. snapshot -> free devices, quota usage, shares (``Capacity``, ``QuotaBook``, ``Shares``);
2. triage: unknown project or class (invalid), backoff not over, budget spent with
   ``action: wait``; a spent budget with ``action: lower`` demotes the run's class instead;
3. order: priority class (high first); within a class, the project with the lowest weighted
   dominant share goes next (fair share, recomputed as the cycle admits); within a project,
   shortest max_runtime first (``order: shortest``, the default), submit time (``submit``) or
   least attained service (``las``). The classes are served twice: first, high to low, the
   runs within their project's nominal quota, then, high to low, the runs that borrow, so
   that nothing borrows what its owner takes back at once, whatever their classes (under
   strict FIFO a project whose head borrows waits, whole, for the second pass);
4. fit: for each acceptable GPU type, best-fit placement (``placement.place``) that also
   respects the backfill reservation, and the project's quota (``QuotaBook.problem``; only a
   preemptible run may borrow: a loan must be reclaimable);
5. preempt: a run that does not fit may get victims (``preempt.find_plan``; who may be one:
   ``_may_preempt``). It is admitted in the same decision, on the placement the plan found,
   so no victim is stopped for nothing: the victims hold nothing from then on (their devices
   free, the preemptor's taken), and the controller launches the preemptor once they have
   exited. A victim of the run's own project and class must have reported a checkpoint
   (unless ``preempt_uncheckpointed``) and run ``min_runtime_before_preemption_s``
   (``_ready``). A plan that takes runs of the run's own class is dropped when they would win
   their GPUs back at once (``_keeps_what_it_frees``). Victims of the lowest classes go first
   (``preempt``), so a reclaim ends: a higher-class victim, requeued, would preempt its
   project's lower-class runs in turn. A plan leaves the reservation (6.) what backfill leaves
   it, unless its run is the anchor or of a higher class (``_preempt_hold``);
6. reserve: the anchor (``parking.anchor``), the run of the highest class that has waited
   longest (submit time, seq, id; not the order's head) among those blocked by capacity or by
   its own project's quota when the cycle begins and that could ever be admitted, or the
   anchor the engine kept from its last cycle (``Snapshot.anchor``) even if it fits now, gets
   an EASY reservation of nodes and quota (``backfill.reserve``; its time is unknown when it
   waits for runs without ``max_runtime``); no other run may take what it waits for unless it
   is shown to end before it, and the anchor itself is never held back by it. Without the kept
   anchor, a run the order prefers would take its GPUs the moment they free. When the cycle
   had no anchor or admitted it, the engine keeps instead the oldest run (highest class first)
   that could ever be admitted and that the cycle overtook, admitting a later run of its class
   and not it (``parking.overtaken``): one that fits as every cycle begins would else wait
   behind a stream the order prefers for ever, never blocked, never the anchor;
7. explain: every run not admitted gets a reason code, a sentence and, where the runs it
   waits for have ``max_runtime``, an estimated start time (``backfill.EtaBook``); a lender's
   run names the runs holding what it lent, reclaimable or not, and their ends (``lent``).
Strict FIFO: once a project has a blocked run, its later runs wait behind it (a run held only
for the reservation of an older run of its own project does not block it: the anchor is next).

A cycle reads a ``State`` (built from a snapshot, or kept up to date by the incremental engine)
and judges each queue of interchangeable runs by its head: when the head is blocked and its
followers could do nothing the head could not (no reservation to work around, no possible
victims), they wait for the same reason without being tried one by one.

Parking (``park=True``, best-effort FIFO with fair share): a queue that is surely blocked when
the cycle begins (``parking.candidates``: no acceptable type both has room in quota and a node
set with enough free GPUs, and no possible victim) is not visited at all. Until the cycle
decides a preemption, free capacity only shrinks, quota room only shrinks and the victim pools
do not change, so such a queue would be judged surely blocked at its turn too, and a visit would
change nothing: the decision is the same as a full visit's (the differential test checks it). A
preemption breaks this (its victims give back devices and quota its preemptor does not take,
which may unblock a parked queue), so the incremental engine discards a parked cycle that
preempts and runs it again visiting every queue (``engine.Incremental.cycle``). The anchor does
not depend on visit order for the same reason. Without fair share the projects take turns by
their oldest queue head, parked heads included, so there every queue is visited. Full visits are
still used to explain every run.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from enum import Enum
from itertools import accumulate
from typing import Any

from mlops_gpu.core import borrowers, eligibility, parking, search_memo
from mlops_gpu.core import reason_text as rt
from mlops_gpu.core.backfill import (
    EtaBook,
    Reservation,
    expected_end,
    freed_by_quota,
    quota_ends,
    quota_eta,
    quota_limit,
    reserve,
    start_of,
)
from mlops_gpu.core.decision import Admission, Decision, PendingReason, Preemption, ReasonCode
from mlops_gpu.core.explain import shape_text
from mlops_gpu.core.fairshare import (
    Shares,
    attained_now,
    budget_exceeded,
    las_level,
)
from mlops_gpu.core.lent import Held
from mlops_gpu.core.placement import place, request_amount
from mlops_gpu.core.preempt import Hold, find_plan, lost_gpu_s
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.core.state import ShapeKey, State
from mlops_gpu.core.type_choice import order_types
from mlops_gpu.model import Placement, Run

#: ``Cycle._quota_term``: holders, their usage, the limit, their runs' ends, GPUs released by each
_QuotaTerm = tuple[Collection[str], float, float | None, list[tuple[float, float]], list[float]]


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


class Cycle:
    def __init__(
        self,
        state: State,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
        park: bool = False,
    ) -> None:
        state.set_time(now)  # 1. snapshot
        self.state = state
        # Without the active runs: the helpers a cycle calls read them from the state (a
        # tuple of every active run each cycle would cost what the cluster holds, not what
        # changed); ``explain`` adds them (``_with_active``).
        self.snap = state.view(now, usage_history, spent, with_active=False)
        self._full: Snapshot | None = None
        self.cap, self.quota = state.cap, state.quota
        self.shares = Shares(self.snap, self.cap.used, state.capacity_by_type)
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.reasons: dict[str, PendingReason] = {}
        self.going: set[str] = set(state.going)
        # Parking needs the order of turns not to depend on skipped queues: with fair share a
        # project's turn comes by its share; without, by its oldest queue head, and a parked
        # head counts there too (a from-scratch cycle visits it first and finds it blocked).
        pol = state.template.policy
        self.park = park and pol.queueing != "strict-fifo" and pol.fair_share
        self._reservation: Reservation | None = None
        self._reserved = False  # whether the anchor's reservation has been worked out
        self.anchor: str | None = None  # the run the reservation is for (``parking.anchor``)
        self.blocked_projects: dict[str, str] = {}
        #: strict FIFO: the projects whose head had to borrow (the borrowing passes serve them)
        self._deferred: set[str] = set()
        self._held_at: tuple[int, Held] | None = None
        self.notes = {
            p: budget_exceeded(self.snap, p)
            for p, proj in self.snap.projects.items()
            if proj.budget is not None
        }
        # For explain: runs in the order the cycle met them; a run's followers share its reason.
        self.met: list[tuple[Run, tuple[str, ShapeKey, int, int] | None]] = []
        self.lazy: set[str] = set()
        self._used_at_start = dict(self.cap.used)
        self._exhausted: set[tuple[str, str]] = set()
        #: (root, type) -> admissions so far when found not exhausted: usage changes only
        #: by admissions within a cycle (preemption trials restore what they change)
        self._lends: dict[tuple[str, str], int] = {}
        self.fit_memo: dict[tuple[str, int, int, str | None], tuple[int, bool]] = {}
        self.pools: dict[tuple[str, str], tuple[str, ...]] = {}  # ``search_memo.key_of``
        self._lenders: dict[tuple[str, str], tuple[str, ...]] = {}  # ``lenders_at_start``
        self.gone: dict[tuple[str, ...], tuple[int, tuple[str, ...]]] = {}  # ``.gone_on``
        self.behind: list[tuple[str, str, ShapeKey, int, int]] = []
        self._running_now: list[Run] = []
        #: (project, GPU type) -> ``_quota_term``, for the explanation's quota ETAs
        self._quota_terms: dict[tuple[str, str, bool], _QuotaTerm] = {}
        self._quota_ends: dict[
            tuple[tuple[str, ...], str], tuple[list[tuple[float, float]], list[float]]
        ] = {}
        #: runs whose failed search this cycle put in the memo (``Incremental.cycle`` drops
        #: them when it discards the cycle)
        self.remembered: list[str] = []

    # -- 2. triage, 3. order --------------------------------------------------------------
    def _level_of(self, project: str, class_value: int) -> int | None:
        """The class value a queue is served at, or None when its budget makes it wait."""
        note = self.notes.get(project)
        if note is None:
            return class_value
        budget = self.snap.projects[project].budget
        assert budget is not None
        if budget.action == "wait":
            return None
        lowered = self.snap.priority_classes.get(budget.lower_to or "", class_value)
        return min(lowered, class_value)

    def run(self) -> Decision:
        levels: dict[int, dict[str, list[Range]]] = defaultdict(lambda: defaultdict(list))
        if self.park:
            visit: Mapping[str, Iterable[ShapeKey]] = parking.candidates(self)
        else:
            visit = self.state.queues
            _ = self.reservation  # at the cycle's start, as parking would see it
        for project, sks in visit.items():
            queues = self.state.queues[project]
            for sk in sks:
                q = queues[sk]
                level = self._level_of(project, int(sk[0]))  # type: ignore[call-overload]
                if q and level is not None:
                    levels[level][project].append([sk, 0, len(q), q])
        # Runs within nominal quota, of every class, before the runs that borrow, of any
        # class (a borrower of a higher class must not take what an owner takes back).
        borrowing: list[dict[str, list[Range]]] = []
        for level in sorted(levels, reverse=True):
            deferred: dict[str, list[Range]] = defaultdict(list)
            self._serve(levels[level], deferred)
            borrowing.append(deferred)
        for deferred in borrowing:
            self._serve(deferred, None)
        return Decision(
            tuple(self.admissions), tuple(self.preemptions), tuple(self.reasons.values())
        )

    def _serve(
        self,
        ranges: Mapping[str, list[Range]],
        defer: dict[str, list[Range]] | None,
    ) -> None:
        """Serve one priority class in fair-share order: the project with the lowest share
        takes its next run, until every project's runs are admitted, deferred or waiting.
        Without fair share, the project whose next run is oldest goes first (one FIFO
        across projects, as Kueue orders queue heads by creation time)."""
        fair = self.snap.policy.fair_share

        def key(p: str) -> tuple[object, ...]:
            if fair:
                return (self.shares.share(p), p)
            keys = self.state.order_keys
            heads = [keys[rg[3][rg[1]].id] for rg in ranges[p] if rg[1] < rg[2]]
            return (min(heads, default=(0, 0.0, 0)), p)

        heap = [(key(p), p) for p in sorted(ranges) if ranges[p]]
        heapq.heapify(heap)
        while heap:
            _, project = heapq.heappop(heap)
            if self._turn(project, ranges[project], defer):
                heapq.heappush(heap, (key(project), project))

    def _turn(
        self,
        project: str,
        ranges: list[Range],
        defer: dict[str, list[Range]] | None,
    ) -> bool:
        """The project's next run in its own order that can start: True once one is admitted,
        False when none can (its queues are then all judged)."""
        keys = self.state.order_keys
        strict = self.snap.policy.queueing == "strict-fifo"
        if project in self.blocked_projects:  # strict FIFO: an older run of it is blocked
            self._hold_behind(project, ranges, None)
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
            if defer is not None and (project in self._deferred or self._must_borrow(run)):
                for r2 in ranges if strict else [rg]:
                    if r2[1] < r2[2]:
                        defer[project].append([r2[0], r2[1], r2[2], r2[3]])
                        r2[1] = r2[2]
                if strict:  # its later runs, of lower classes too, wait behind the borrower
                    self._deferred.add(project)
                    return False
                continue
            if not strict and (search_memo.recalls_failure(self, run) or self._surely_blocked(run)):
                # Its preemption search failed for want of capacity, and nothing since could
                # change that (``search_memo``; asked first: most heads a parked cycle visits
                # are such), or it cannot fit anywhere and could change nothing: no placement,
                # no victim, nothing to wait for. ``_try`` would only write its reason, worked
                # out if someone asks (``explain``).
                self.lazy.add(run.id)
                self.met.append((run, (project, rg[0], rg[1] + 1, rg[2])))
                rg[1] = rg[2]
                continue
            outcome = self._try(run)
            if outcome is Outcome.ADMITTED:
                self.met.append((run, None))
                rg[1] += 1
                return True
            if strict and not self._held_for_own(outcome, project):
                self.met.append((run, None))
                self.blocked_projects[project] = run.id
                rg[1] += 1
                self._hold_behind(project, ranges, run.id)
                return False
            if outcome is Outcome.BLOCKED:  # the rest of this queue waits for the same reason
                self.met.append((run, (project, rg[0], rg[1] + 1, rg[2])))
                rg[1] = rg[2]
            else:  # Outcome.RESERVED
                # Identical runs behind it differ only in max_runtime: those that would not
                # end before the reservation wait for the same reason; try the first that would.
                # (The anchor itself, when it is one of them, is tried: nothing is held from it.)
                res = self.reservation
                assert res is not None
                q, j = rg[3], rg[1] + 1
                latest = res.at - self.snap.now  # (inf when unknown: none ends before)
                while j < rg[2]:
                    mr = q[j].spec.max_runtime_s
                    if q[j].id == res.run_id or (mr is not None and mr <= latest < math.inf):
                        break
                    j += 1
                self.met.append((run, (project, rg[0], rg[1] + 1, j)))
                rg[1] = j

    def _held_for_own(self, outcome: Outcome, project: str) -> bool:
        """Strict FIFO: a run that waits only for the reservation of an older run of its own
        project (by age; under ``shortest`` or ``las`` it may come later in the order) does not
        block the project, or the anchor behind it would never be tried."""
        res = self.reservation
        return (
            outcome is Outcome.RESERVED
            and res is not None
            and self.state.pending[res.run_id].project == project
        )

    def _hold_behind(self, project: str, ranges: list[Range], head: str | None) -> None:
        head = head or self.blocked_projects[project]
        for rg in ranges:
            if rg[1] < rg[2]:
                self.behind.append((project, head, rg[0], rg[1], rg[2]))
                rg[1] = rg[2]

    def _must_borrow(self, run: Run) -> bool:
        amount = request_amount(run)
        return not any(
            self.quota.within_nominal(run.project, t, amount) for t in self.state.types_of(run)
        )

    # -- 4. fit, 5. preempt, 6. reserve -------------------------------------------------
    @property
    def reservation(self) -> Reservation | None:
        """The anchor's reservation, worked out from the cycle's starting state: the first use
        comes before the first admission (``_try`` asks for it before placing). It is dropped
        once the anchor is admitted."""
        if not self._reserved:
            self._reserved = True
            if self.snap.policy.backfill:
                anchor = parking.anchor(self)
                if anchor is not None:
                    run, types = anchor
                    self.anchor = run.id
                    now = self.snap.now
                    st = self.state
                    self._reservation = reserve(
                        self.snap,
                        self.cap,
                        run,
                        types,
                        lambda n: st.lines(n, now),
                        lambda n, free, need: st.reach(n, now, free, need),
                        lambda t: st.earliest(run, t, now),
                        lambda t: self._quota_of(run, t),
                    )
                    if self._reservation is not None:
                        self._hold_terms(run, self._reservation)
        return self._reservation

    def _hold_terms(self, run: Run, res: Reservation) -> None:
        """What the reservation does not hold against others: whether the anchor borrows
        (then runs within their own nominal quota go first), and the GPUs its own project's
        runs without max_runtime surely free on its nodes before it (its quota waits for them)."""
        t, amount = res.gpu_type, request_amount(run)
        res.borrows = not self.quota.within_nominal(run.project, t, amount)
        if res.limit is None:
            return
        short = self.quota.used[(run.project, t)] + amount - res.limit - res.released
        unknown_on: dict[str, int] = defaultdict(int)
        for a in self.state.held.get((run.project, t), {}).values():
            if a.placement is not None and expected_end(self.snap, a) is None:
                for slot in a.placement.slots:
                    unknown_on[slot.node] += len(slot.devices)
        res.freed = freed_by_quota(short, unknown_on, res.nodes)

    def _quota_of(
        self, run: Run, gpu_type: str
    ) -> tuple[float | None, float, list[tuple[float | None, float]]]:
        """``backfill.QuotaOf`` for the anchor ``run``: the quota it counts on, its project's
        usage, and the expected ends of the project's own runs on the type."""
        limit = quota_limit(
            self.quota, run.project, gpu_type, request_amount(run), run.spec.preemptible
        )
        used = self.quota.used[(run.project, gpu_type)]
        if limit is None:
            return None, used, []
        snap = self.snap
        ends = [
            (expected_end(snap, a), float(a.placement.gpu_amount))  # type: ignore[union-attr]
            for a in self.state.held.get((run.project, gpu_type), {}).values()
        ]
        return limit, used, ends

    def kept_anchor(self) -> str | None:
        """The anchor an engine that applies this cycle keeps for the next (``State.anchor``):
        this cycle's, unless it was admitted; else the oldest run the cycle overtook
        (``parking.overtaken``). (Asked after ``run``: when no run was tried the reservation
        was not worked out, and nothing was admitted, so the starting state is still there to
        work it out from.)"""
        _ = self.reservation
        admitted = {a.run_id for a in self.admissions}
        if self.anchor is not None and self.anchor not in admitted:
            return self.anchor
        return parking.overtaken(self) if self.snap.policy.backfill else None

    def _backfill_filter(self, run: Run) -> Callable[..., bool] | None:
        res = self.reservation
        if res is None or res.run_id == run.id:
            return None
        ends = None if run.spec.max_runtime_s is None else self.snap.now + run.spec.max_runtime_s
        if res.borrows and run.project != res.project:
            amount, quota = request_amount(run), self.quota
            return lambda node, free_after: (
                quota.within_nominal(run.project, node.gpu_type, amount)
                or res.allows(node, free_after, ends)
            )
        return lambda node, free_after: res.allows(node, free_after, ends)

    def _preempt_hold(self, run: Run) -> Hold:
        """What ``run``'s preemption plan must leave to the reservation: as for backfill, unless
        ``run`` is the anchor or of a higher class (priority wins)."""
        res = self.reservation
        if res is None or res.run_id == run.id:
            return None
        anchor = self.state.pending[res.run_id]
        if self._level(run) > self._level(anchor):
            return None
        flt = self._backfill_filter(run)
        assert flt is not None
        return flt, lambda t, amount: not self._quota_held(run, t, amount)

    def _level(self, run: Run) -> int:
        return self._level_of(run.project, self.snap.priority_of(run)) or 0

    def _quota_held(self, run: Run, gpu_type: str, amount: float) -> bool:
        """Whether the reservation holds quota that ``run`` taking ``amount`` would take."""
        res = self.reservation
        if res is None or res.run_id == run.id:
            return False
        mr = run.spec.max_runtime_s
        ends = None if mr is None else self.snap.now + mr
        used = self.quota.used[(run.project, gpu_type)]
        return not res.allows_quota(run.project, gpu_type, used + amount, ends)

    def _try(self, run: Run) -> Outcome:
        types = self.state.types_of(run)
        quota_msgs: list[str] = []
        fits_without_reservation = quota_held = False
        flt = self._backfill_filter(run)
        placed: dict[str, Placement | None] = {}
        if (
            len(types) > 1
            and run.request.shape != "mig"
            and self.snap.policy.placement == "fragmentation"
            and self.cap.fragmentable
        ):
            # Any of several types: headroom left by restricted runs, then the placement
            # that fragments least (``type_choice``).
            placed = {t: place(self.snap, self.cap, run, t, flt) for t in types}
            types = order_types(self.cap, types, placed, run.request.shape != "cpu")
        for t in types:
            placement = placed[t] if t in placed else place(self.snap, self.cap, run, t, flt)
            if placement is None and flt is not None:
                fits_without_reservation |= place(self.snap, self.cap, run, t) is not None
            amount = placement.gpu_amount if placement else request_amount(run)
            problem = self.quota.problem(run.project, t, amount, run.spec.preemptible)
            if problem is not None:
                quota_msgs.append(problem)
                continue
            if placement is not None:
                if self._quota_held(run, t, amount):
                    quota_held = True
                    continue
                self._admit(run, placement)
                return Outcome.ADMITTED
        res = self.reservation
        if (fits_without_reservation or quota_held) and res is not None:
            # It fits but for the reservation: it waits for it (and does not preempt); a run
            # behind it with a shorter max_runtime may still backfill.
            shape, held = shape_text(run, types), fits_without_reservation
            self._wait(
                run,
                ReasonCode.RESERVED,
                rt.reserved(shape, held, res.run_id, res.project, res.gpu_type, res.at),
            )
            return Outcome.RESERVED
        if self._victims_possible(run, types) and self._preempt(run, types):
            return Outcome.ADMITTED  # with its victims, in this decision
        if len(quota_msgs) == len(types) and types:
            self._wait(run, ReasonCode.QUOTA, rt.over_quota(shape_text(run, types), quota_msgs))
        else:
            self._wait_capacity(run, types)
        return Outcome.BLOCKED

    def _surely_blocked(self, run: Run) -> bool:
        """A cheap test that ``_try`` would find ``run`` blocked with no side effect: on each
        acceptable GPU type it is over quota with nothing left to borrow, or (a whole-GPU
        request) no node set can take it now (the free-count index); and no running run could
        be its victim."""
        req = run.request
        types = self.state.types_of(run)
        if self.snap.policy.preemption and self._victims_possible(run, types):
            return False  # (asked first: most heads a parked cycle visits have possible victims)
        open_types = [t for t in types if not self._surely_over_quota(run, t)]
        if open_types:
            if req.shape != "whole" or req.topology_key is not None:
                return False
            for t in open_types:
                if parking.node_sets(self, t, req.gpus, req.nodes, run.spec.backend):
                    return False  # it might fit
        return True

    def _surely_over_quota(self, run: Run, gpu_type: str) -> bool:
        """True only when ``QuotaBook.problem`` would name a problem (False: not sure)."""
        return request_amount(run) > self.room(run.project, gpu_type) + 1e-9

    def room(self, project: str, gpu_type: str) -> float:
        """The most of ``gpu_type`` the project could add without a certain quota problem:
        its nominal left, or, while its cohort tree still lends, up to nominal plus its
        borrowing limit (unbounded without one). It only shrinks between a cycle's evictions."""
        q = self.quota.quota(project, gpu_type)
        used = self.quota.used[(project, gpu_type)]
        root = self.quota.root.get(project)
        if root is None or self._cohort_exhausted(root, gpu_type):
            return q.nominal - used
        if q.borrowing_limit is None:
            return float("inf")
        return q.nominal + q.borrowing_limit - used

    def _cohort_exhausted(self, root: str, gpu_type: str) -> bool:
        """Whether the tree lends nothing more of ``gpu_type``. Between evictions usage only
        grows, so once exhausted it stays exhausted: remembered until a preemption gives quota
        back (``_preempt`` forgets it)."""
        key = (root, gpu_type)
        if key in self._exhausted:
            return True
        if self._lends.get(key) == len(self.admissions):
            return False
        borrowed, lendable = self.quota.cohort_sums(root, gpu_type)
        if lendable - borrowed <= 1e-9:
            self._exhausted.add(key)
            return True
        self._lends[key] = len(self.admissions)
        return False

    def _diagnose(self, run: Run) -> None:
        """The reason of a run judged by ``_surely_blocked``, without side effects: it cannot
        be placed, so what remains is which limit to name."""
        types = self.state.types_of(run)
        amount = request_amount(run)
        pre = run.spec.preemptible
        quota_msgs = [m for t in types if (m := self.quota.problem(run.project, t, amount, pre))]
        if quota_msgs and len(quota_msgs) == len(types):
            self._wait(run, ReasonCode.QUOTA, rt.over_quota(shape_text(run, types), quota_msgs))
        else:
            self._wait_capacity(run, types)

    def _admit(self, run: Run, placement: Placement) -> None:
        if self._reservation is not None and self._reservation.run_id == run.id:
            self._reservation = None  # it started: nothing more to hold for it
        self.cap.take(run.project, placement, run.request.gpu_types)
        self.shares.add(run.project, placement.gpu_type, placement.gpu_amount)
        self.admissions.append(Admission(run.id, placement))

    def _victims_possible(self, run: Run, types: list[str]) -> bool:
        """Whether any active run might be a victim of ``run`` (a cheap over-estimate: when
        False, the preemption search would find nothing)."""
        if not self.snap.policy.preemption:
            return False
        mine = self.snap.priority_of(run)
        root = self.quota.root.get(run.project)
        amount = request_amount(run)
        for t in types:
            pool = self.state.victims.get((run.project, t))
            if pool and (any(v < mine for v in pool) or (mine in pool and self.peers(run, t))):
                return True
            if borrowers.possible(self, run, t):
                return True
            if root is None or not self.quota.within_nominal(run.project, t, amount):
                continue
            for m in self.lenders_at_start(root, t):
                if m != run.project and self.state.victims.get((m, t)):
                    return True
        return False

    def peers(self, run: Run, gpu_type: str) -> bool:
        """Whether a run of the same project and class on ``gpu_type`` might be a victim of
        ``run`` (an over-estimate of ``_may_preempt``; False is certain). Under ``shortest``,
        only when one is expected to go on for more than the ratio x run's max_runtime."""
        cls = self.snap.priority_of(run)
        to_go = self.state.longest_to_go(run.project, gpu_type, cls, self.snap.now)
        return self.peers_going_on(run, to_go)

    def peers_going_on(self, run: Run, to_go: float) -> bool:
        """``peers``, given the most time any same-class victim candidate is expected to go
        on for (``State.longest_to_go``; the parking lot reads it once a cycle)."""
        order = self.snap.policy.order
        return order == "las" or (order == "shortest" and self._outlasts(run, to_go))

    def _outlasts(self, run: Run, to_go: float) -> bool:
        """Under ``shortest``: whether a run of ``run``'s class with ``to_go`` seconds left
        (infinite when unknown) goes on for more than the ratio x ``run``'s whole
        max_runtime (ratio >= 1, so two runs never swap back)."""
        mine = run.spec.max_runtime_s
        return mine is not None and to_go > mine * self.snap.policy.shortest_preempt_ratio + 1e-9

    def _victim_pool(self, run: Run, gpu_type: str) -> Iterable[Run]:
        """The runs that ``_may_preempt`` could accept for ``run`` on ``gpu_type``: its own
        project's, and those of cohort members that borrowed it when the cycle began (from
        ``State.running``: preemptible, placed on ``gpu_type``, not being preempted)."""
        running = self.state.running
        yield from running.get((run.project, gpu_type), {}).values()
        root = self.quota.root.get(run.project)
        if root is None:
            return
        for m in self.quota.members[root]:
            if m != run.project and self._borrowed_at_start(m, gpu_type):
                yield from running.get((m, gpu_type), {}).values()

    def lenders_at_start(self, root: str, gpu_type: str) -> tuple[str, ...]:
        """The members of cohort tree ``root`` that borrowed ``gpu_type`` when the cycle began,
        sorted (fixed for the cycle, so worked out once: the parking lot, the search memo's
        keys and ``_victims_possible`` ask for every queue head)."""
        key = (root, gpu_type)
        found = self._lenders.get(key)
        if found is None:
            members = self.quota.members[root]
            found = tuple(sorted(m for m in members if self._borrowed_at_start(m, gpu_type)))
            self._lenders[key] = found
        return found

    def _borrowed_at_start(self, project: str, gpu_type: str) -> bool:
        """Whether the project borrowed ``gpu_type`` when the cycle began: only such borrowing
        is reclaimed (a project that borrows because of this cycle's own admissions does not
        lose a run it started within its quota)."""
        nominal = self.quota.quota(project, gpu_type).nominal
        return self._used_at_start.get((project, gpu_type), 0.0) > nominal + 1e-9

    def _may_preempt(self, run: Run, victim: Run) -> bool:
        """Whether ``victim`` may be a victim of ``run`` now."""
        return self._may_ever_preempt(run, victim) and self._ready(run, victim)

    def _ready(self, run: Run, victim: Run) -> bool:
        """Rule B's conditions that time or a checkpoint can make true (the rest is
        ``_may_ever_preempt``): a victim of ``run``'s own project and class has reported a
        checkpoint (unless ``preempt_uncheckpointed``) and has run for at least
        ``min_runtime_before_preemption_s`` since it started (else was admitted; with
        neither, it has not run). Lower classes and reclaimed borrowing need neither; a run of
        another project taken by ``borrowers`` needs both, and its project's share above."""
        snap = self.snap
        if snap.priority_of(victim) != snap.priority_of(run):
            return True
        if victim.project != run.project:
            if self._reclaims(run, victim):
                return True
            if not borrowers.share_above(self, run, victim):
                return False
        pol = snap.policy
        if victim.last_checkpoint_at is None and not pol.preempt_uncheckpointed:
            return False
        start = start_of(victim)
        return start is not None and snap.now - start >= pol.min_runtime_before_preemption_s

    def _may_ever_preempt(self, run: Run, victim: Run) -> bool:
        """``_may_preempt`` without ``_ready``: the part that only turns false as the cycle's
        clock moves on (under ``shortest`` a victim's time to go shrinks; under ``las`` the
        memo is not used), so the search memo may build certain failures on it."""
        if victim.id in self.going:
            return False
        snap = self.snap
        if victim.project == run.project:
            mine, theirs = snap.priority_of(run), snap.priority_of(victim)
            if theirs < mine:
                return True
            if theirs > mine:
                return False
            if snap.policy.order == "las":
                return las_level(snap, attained_now(snap, victim)) > las_level(
                    snap, run.attained_gpu_s
                )
            if snap.policy.order == "shortest":
                # a victim without max_runtime has no known end: not one (rule B)
                end = expected_end(snap, victim)
                return end is not None and self._outlasts(run, end - snap.now)
            return False
        return self._reclaims(run, victim) or borrowers.may_ever(self, run, victim)

    def _reclaims(self, run: Run, victim: Run) -> bool:
        """Whether ``run`` may take ``victim`` (another project's) back as lent quota."""
        t = victim.placement.gpu_type if victim.placement else ""
        root = self.quota.root.get(victim.project)
        return (
            root is not None
            and root == self.quota.root.get(run.project)
            and self._borrowed_at_start(victim.project, t)
            and self.quota.within_nominal(run.project, t, request_amount(run))
        )

    def _preempt(self, run: Run, types: list[str]) -> bool:
        """Find victims for ``run`` and, with a plan, admit it in this decision on the plan's
        placement: the victims give back everything they hold (devices, quota, fair-share
        usage), the run takes its placement, and the rest of the victims' devices are free
        for the runs after it. False (nothing changed) without a plan."""
        snap = self.snap
        memo = None  # (a failure it would recall never gets here: ``_turn`` asks first)
        if search_memo.applies(self, run):
            memo = self.state.memo
        ruled_out: set[str] = set()
        plan = find_plan(
            snap,
            self.cap,
            self.quota,
            run,
            types,
            self._may_preempt,
            pool=lambda t: self._victim_pool(run, t),
            ruled_out=ruled_out,
            may_ever=self._may_ever_preempt,
            hold=self._preempt_hold(run),
        )
        if plan is None and memo is not None and ruled_out == set(types):
            memo.remember(run, search_memo.key_of(self, run, types), snap.now)
            self.remembered.append(run.id)
        if plan is None or not self._keeps_what_it_frees(run, plan.victims, plan.placement):
            return False
        if not borrowers.keeps(self, run, plan.victims, plan.placement):
            return False
        whys = {v.id: self._why_preempted(run, v) for v in plan.victims}  # (before any goes)
        for v in plan.victims:
            self.going.add(v.id)
            placed = v.placement
            assert placed is not None
            self.cap.release(v.project, placed, v.request.gpu_types)
            self.shares.add(v.project, placed.gpu_type, -placed.gpu_amount)
            self.preemptions.append(
                Preemption(
                    v.id,
                    whys[v.id],
                    v.spec.checkpoint.signal,
                    v.spec.checkpoint.grace_s,
                    run.id,
                    lost_gpu_s(snap, v),
                )
            )
        # The victims gave back quota: a cohort tree found exhausted may lend again (the memo
        # assumes usage only grows, which holds between evictions only)
        self._exhausted.clear()
        self._admit(run, plan.placement)
        return True

    def _why_preempted(self, run: Run, v: Run) -> str:
        if v.project == run.project:
            return f"preempted for run {run.id} (priority {run.spec.priority})"
        if borrowers.taken_by_rule(self, run, v):
            return borrowers.why(self, run, v)
        return (
            f"reclaimed: project {run.project} needs its nominal quota back; project "
            f"{v.project} was borrowing"
        )

    def _keeps_what_it_frees(self, run: Run, victims: Iterable[Run], placement: Placement) -> bool:
        """Whether a run that preempts runs of its own class (``las``, ``shortest``) would get
        the GPUs it frees. The runs within nominal quota (of every class) are served before the
        runs that borrow: if the run would borrow once its victims are gone while one of those
        victims, requeued, would not, the victim takes its GPUs back first and the two trade
        places forever. So either the run is within nominal then, or every such victim would
        borrow too (and comes after the run in its project's order)."""
        snap = self.snap
        mine = snap.priority_of(run)
        peers = [v for v in victims if v.project == run.project and snap.priority_of(v) == mine]
        if not peers:
            return True
        gone = [a for a in victims if a.project == run.project and a.placement is not None]
        for a in gone:
            self.cap.release(a.project, a.placement, a.request.gpu_types)  # type: ignore[arg-type]
        try:
            t, q = placement.gpu_type, self.quota
            if q.within_nominal(run.project, t, placement.gpu_amount):
                return True
            return not any(
                q.within_nominal(run.project, t, v.placement.gpu_amount)  # type: ignore[union-attr]
                for v in peers
            )
        finally:
            for a in gone:
                self.cap.take(a.project, a.placement, a.request.gpu_types)  # type: ignore[arg-type]

    # -- 7. explain ---------------------------------------------------------------------
    def _wait(self, run: Run, code: ReasonCode, reason: str, eta: float | None = None) -> None:
        self.reasons[run.id] = PendingReason(run.id, code, reason, eta)

    def _wait_capacity(self, run: Run, types: list[str]) -> None:
        fits_ever = self.state.ever_fits(run)
        if not fits_ever:
            self._wait(run, ReasonCode.UNSCHEDULABLE, rt.unschedulable(shape_text(run, types)))
            return
        blocks = [(t, self.cap.largest_free_block(t)) for t in fits_ever]
        borrowed = [
            (t, p, b)
            for t in fits_ever
            for p, b in sorted(self.quota.borrowers(run.project, t).items())
        ]
        lent = None
        if borrowed and self.quota.within_nominal(run.project, fits_ever[0], request_amount(run)):
            # which runs hold what it lent, whether they can be reclaimed, and their ends
            held = self._held()
            lent = [held.runs(p, t) for t, p, _ in borrowed]
        text = rt.no_capacity(shape_text(run, types), blocks, borrowed, lent)
        self._wait(run, ReasonCode.NO_CAPACITY, text)

    def _held(self) -> Held:
        """The active runs by (project, type), for a lender's reason (``lent``): read once
        per cycle, again after a preemption (its victims hold nothing)."""
        if self._held_at is None or self._held_at[0] != len(self.preemptions):
            held = Held(self.snap, self.state.active.values(), self.going)
            self._held_at = (len(self.preemptions), held)
        return self._held_at[1]

    def _with_active(self) -> Snapshot:
        """The cycle's snapshot with the state's active runs (the ETAs read their ends); the
        victims this cycle chose are marked as being preempted (they hold nothing now)."""
        if self._full is None:
            chosen = {p.run_id for p in self.preemptions}
            active = tuple(
                replace(a, preempt_requested=True) if a.id in chosen else a
                for a in self.state.active.values()
            )
            self._full = replace(self.snap, active=active)
        return self._full

    def explain(self) -> list[PendingReason]:
        """A reason for every pending run not admitted, with ETAs: the reservation's time
        for its run, the profile estimate (``EtaBook``) for the rest, in the order met."""
        snap, st = self._with_active(), self.state
        out: dict[str, PendingReason] = {}
        for rid, why in st.invalid.items():
            out[rid] = PendingReason(rid, ReasonCode.INVALID, why)
        for run in st.in_backoff():
            out[run.id] = PendingReason(
                run.id,
                ReasonCode.BACKOFF,
                f"requeued as attempt {run.attempt}; backoff for "
                f"{(run.not_before or snap.now) - snap.now:.0f}s more",
                run.not_before,
            )
        for project, subqueues in st.queues.items():
            note = self.notes.get(project)
            budget = snap.projects[project].budget if project in snap.projects else None
            if note is not None and budget is not None and budget.action == "wait":
                for q in subqueues.values():
                    for run in q:
                        out[run.id] = PendingReason(
                            run.id,
                            ReasonCode.BUDGET,
                            f"{note}; it waits until the window frees budget",
                        )
        admitted = {a.run_id for a in self.admissions}
        now_running = [
            replace(
                st.pending[a.run_id],
                placement=a.placement,
                admitted_at=snap.now,
                started_at=snap.now,
            )
            for a in self.admissions
        ]
        etas = EtaBook(snap, self.cap, now_running)
        self._running_now = now_running

        def booked(run: Run, p: PendingReason) -> PendingReason:
            types = st.types_of(run)
            if p.reason_code in (ReasonCode.UNSCHEDULABLE, ReasonCode.INVALID):
                return p
            eta, why = etas.book(types, request_amount(run), run.spec.max_runtime_s)
            if p.reason_code is ReasonCode.QUOTA:  # it needs the GPUs and the quota
                at, why = self._quota_eta(run, types)
                eta = max(at, eta) if at is not None and eta is not None else at
            res = self.reservation
            if res is not None and res.run_id == run.id:
                # The reservation's time is a bound it keeps; the estimate may be earlier
                # (e.g. its cohort lends before its own project's runs end).
                if math.isfinite(res.at):
                    if eta is None or eta >= res.at:
                        eta, why = res.at, "reserved (EASY backfill)"
                elif eta is None:
                    why = self._unknown_why(res)
            if p.eta is not None:
                eta = max(p.eta, eta) if eta is not None else p.eta
            return PendingReason(
                run.id, p.reason_code, p.reason if eta is not None else f"{p.reason}; {why}", eta
            )

        for run, followers in self.met:
            if run.id in self.lazy:
                self._diagnose(run)
            p = self.reasons.get(run.id)
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
            for project, head, sk, start, end in self.behind
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

    def _unknown_why(self, res: Reservation) -> str:
        """Why a reservation's time is unknown: the runs it waits for that have no
        max_runtime (on its nodes, and its project's own runs holding the quota it needs)."""
        nodes = set(res.unknown_nodes)
        names = sorted(
            a.id
            for a in self.state.active.values()
            if a.placement is not None
            and a.id not in self.state.going
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

    def _quota_eta(self, run: Run, types: list[str]) -> tuple[float | None, str]:
        best: tuple[float | None, str] = (None, rt.NO_ETA["plain"])
        for t in types:
            key = (run.project, t, run.spec.preemptible)
            if key not in self._quota_terms:  # (the same for every run of the explanation)
                self._quota_terms[key] = self._quota_term(run.project, t, run.spec.preemptible)
            holders, used, limit, ends, cum = self._quota_terms[key]
            eta, why = quota_eta(
                self._with_active(), used, limit, holders, t, request_amount(run), (), ends, cum
            )
            if eta is not None and (best[0] is None or eta < best[0]):
                best = (eta, why)
            elif best[0] is None:
                best = (None, why)
        return best

    def _quota_term(self, project: str, t: str, preemptible: bool = True) -> _QuotaTerm:
        """Whose runs hold the quota a run of ``project`` waits for on ``t``, what they hold,
        its limit (None: unknown), their runs' ends (``quota_ends``) and the GPUs released by
        each. A run that is not preemptible waits for its project's nominal quota alone (only
        a preemptible run borrows)."""
        book = self.quota
        q = book.quota(project, t)
        limit = None if q.borrowing_limit is None else float(q.nominal + q.borrowing_limit)
        holders: Collection[str] = (project,)
        root = book.root.get(project)
        if root is None or not preemptible:
            limit = float(q.nominal)
        elif limit is None and all(
            book.quota(m, t).lending_limit is None for m in book.members[root]
        ):
            # Without lending limits, a borrower is admitted once the tree's members hold no
            # more than their nominal quotas together (``QuotaBook.admits``).
            holders = book.members[root]
            limit = float(sum(book.quota(m, t).nominal for m in holders))
        used = sum(book.used[(m, t)] for m in holders)
        key = (tuple(holders), t)
        if key not in self._quota_ends:  # (a cohort's, once for all its members)
            ends = quota_ends(self._with_active(), holders, t, self._running_now)
            self._quota_ends[key] = (ends, list(accumulate(a for _, a in ends)))
        return (holders, used, limit, *self._quota_ends[key])


def decide_default(snap: Snapshot, explain: bool = True) -> Decision:
    """From scratch: build the state from ``snap``, run one cycle, explain every run (unless
    ``explain`` is False: then ``Decision.pending`` is empty)."""
    return decide_keeping(snap, explain)[0]


def decide_keeping(snap: Snapshot, explain: bool = True) -> tuple[Decision, str | None]:
    """``decide_default``, and the anchor an engine applying the decision keeps for the next
    cycle (``Snapshot.anchor``; ``Cycle.kept_anchor``). The policy sees only the runs
    ``eligibility.gate`` passes; the others get its reasons (in the snapshot's order)."""
    g = eligibility.gate(snap)
    if g.waiting:
        full = snap
        anchor = snap.anchor if snap.anchor not in g.waiting else None
        d, kept = decide_keeping(replace(snap, pending=g.eligible, anchor=anchor), explain)
        if explain:
            mine = {p.run_id: p for p in d.pending}
            mine.update(g.waiting)
            d = replace(d, pending=tuple(mine[r.id] for r in full.pending if r.id in mine))
        return replace(d, doomed=g.doomed), kept
    cycle = Cycle(State.from_snapshot(snap), snap.now, snap.usage_history, snap.spent)
    d = cycle.run()
    kept = cycle.kept_anchor()
    if not explain:
        return Decision(d.admissions, d.preemptions, ()), kept
    reasons = {p.run_id: p for p in cycle.explain()}
    return Decision(
        d.admissions, d.preemptions, tuple(reasons[r.id] for r in snap.pending if r.id in reasons)
    ), kept


POLICIES: dict[str, Callable[[Snapshot, bool], Decision]] = {"default": decide_default}


def decide(snap: Snapshot, explain: bool = True) -> Decision:
    """The scheduling decision for ``snap`` under the policy it names; with ``explain``, a
    reason for every run left pending."""
    return POLICIES[snap.policy.name](snap, explain)


def explain_all(snap: Snapshot) -> tuple[PendingReason, ...]:
    """A reason (and ETA where one can be computed) for every pending run of ``snap``."""
    return decide(snap).pending
