"""``CycleBooks``: what one scheduling cycle holds, and the primitives that read and write it.

A cycle is ``policy.decide_keeping``'s numbered steps, each a module of plain functions that
take the books as their first argument: ``cycle_reserve.work_out`` (6., the reservation),
``cycle.schedule`` (3. order, 4. fit, 5. preempt; who may be a victim: ``cycle_victims``),
``cycle_reserve.kept_anchor`` and ``cycle_explain.explain`` (7.). No class hierarchy: the books
are the one object they share.

Invariants:
- The books are the cycle's ``State`` (``cap``, ``quota``: shared with the state, changed in
  place) plus what the cycle decided: ``admissions``, ``preemptions``, ``reasons``. Within a
  cycle devices and quota change only through ``admit`` (and a preemption's victims giving
  back what they hold, ``cycle._preempt``), so usage only grows between evictions.
- ``level_of``: a project whose budget is spent with ``action: wait`` has no level (its runs
  wait); with ``action: lower`` its runs are served at the lower class, never a higher one.
- ``borrowed_at_start``, ``lenders_at_start`` and ``reclaims`` read the usage as the cycle
  began (``_used_at_start``): only borrowing from before the cycle is reclaimed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from mlops_gpu.core.backfill import Reservation
from mlops_gpu.core.decision import Admission, PendingReason, Preemption, ReasonCode
from mlops_gpu.core.fairshare import Shares, budget_exceeded
from mlops_gpu.core.placement import request_amount
from mlops_gpu.core.queue_keys import ShapeKey
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.core.state import State
from mlops_gpu.model import Placement, Run

#: ``cycle_explain._quota_term``: holders, their usage, the limit, their runs' ends, GPUs released
#: by each
QuotaTerm = tuple[Collection[str], float, float | None, list[tuple[float, float]], list[float]]


class CycleBooks:
    """A cycle's books: its state, and what it decided."""

    def __init__(
        self,
        state: State,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        self.state = state
        # Without the active runs: the helpers a cycle calls read them from the state (a
        # tuple of every active run each cycle would cost what the cluster holds, not what
        # changed); ``explain`` adds them (``_with_active``).
        self.snap = state.view(now, usage_history, spent, with_active=False)
        self.full_snap: Snapshot | None = None
        self.cap, self.quota = state.cap, state.quota
        self.shares = Shares(self.snap, self.cap.used, state.capacity_by_type)
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.reasons: dict[str, PendingReason] = {}
        self.going: set[str] = set(state.going)
        #: the anchor's reservation (step 6, ``cycle_reserve.work_out``, before any admission)
        self.reservation: Reservation | None = None
        self.anchor: str | None = None  # the run the reservation is for (``anchor.anchor``)
        #: step 6 ran: backfill and the kept anchor read its outcome, so they check it did
        self.worked_out = False
        self.blocked_projects: dict[str, str] = {}
        #: strict FIFO: the projects whose head had to borrow (the borrowing passes serve them)
        self.deferred_projects: set[str] = set()
        self.notes = {
            p: budget_exceeded(self.snap, p)
            for p, proj in self.snap.projects.items()
            if proj.budget is not None
        }
        # For explain: runs in the order the cycle met them; a run's followers share its reason.
        self.met: list[tuple[Run, tuple[str, ShapeKey, int, int] | None]] = []
        self.lazy: set[str] = set()
        self._used_at_start = dict(self.cap.used)
        self.behind: list[tuple[str, str, ShapeKey, int, int]] = []
        self.running_now: list[Run] = []

    # -- 2. triage, 3. order --------------------------------------------------------------
    def level_of(self, project: str, class_value: int) -> int | None:
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

    def level(self, run: Run) -> int:
        return self.level_of(run.project, self.snap.priority_of(run)) or 0

    def room(self, project: str, gpu_type: str) -> float:
        """The most of ``gpu_type`` the project could add without a certain quota problem:
        its nominal left, or, while its cohort tree still lends, up to nominal plus its
        borrowing limit (unbounded without one)."""
        q = self.quota.quota(project, gpu_type)
        used = self.quota.used[(project, gpu_type)]
        root = self.quota.root.get(project)
        if root is None or self.cohort_exhausted(root, gpu_type):
            return q.nominal - used
        if q.borrowing_limit is None:
            return float("inf")
        return q.nominal + q.borrowing_limit - used

    def cohort_exhausted(self, root: str, gpu_type: str) -> bool:
        """Whether the tree lends nothing more of ``gpu_type``."""
        borrowed, lendable = self.quota.cohort_sums(root, gpu_type)
        return lendable - borrowed <= 1e-9

    def admit(self, run: Run, placement: Placement) -> None:
        if self.reservation is not None and self.reservation.run_id == run.id:
            self.reservation = None  # it started: nothing more to hold for it
        self.cap.take(run.project, placement, run.request.gpu_types)
        self.shares.add(run.project, placement.gpu_type, placement.gpu_amount)
        self.admissions.append(Admission(run.id, placement))

    def wait(self, run: Run, code: ReasonCode, reason: str, eta: float | None = None) -> None:
        self.reasons[run.id] = PendingReason(run.id, code, reason, eta)

    # -- facts of the cycle's start that the victim rules ask --------------------------------
    def outlasts(self, run: Run, to_go: float) -> bool:
        """Under ``shortest``: whether a run of ``run``'s class with ``to_go`` seconds left
        (infinite when unknown) goes on for more than the ratio x ``run``'s whole
        max_runtime (ratio >= 1, so two runs never swap back)."""
        mine = run.spec.max_runtime_s
        return mine is not None and to_go > mine * self.snap.policy.shortest_preempt_ratio + 1e-9

    def lenders_at_start(self, root: str, gpu_type: str) -> tuple[str, ...]:
        """The members of cohort tree ``root`` that borrowed ``gpu_type`` when the cycle began,
        sorted."""
        members = self.quota.members[root]
        return tuple(sorted(m for m in members if self.borrowed_at_start(m, gpu_type)))

    def borrowed_at_start(self, project: str, gpu_type: str) -> bool:
        """Whether the project borrowed ``gpu_type`` when the cycle began: only such borrowing
        is reclaimed (a project that borrows because of this cycle's own admissions does not
        lose a run it started within its quota)."""
        nominal = self.quota.quota(project, gpu_type).nominal
        return self._used_at_start.get((project, gpu_type), 0.0) > nominal + 1e-9

    def reclaims(self, run: Run, victim: Run) -> bool:
        """Whether ``run`` may take ``victim`` (another project's) back as lent quota."""
        t = victim.placement.gpu_type if victim.placement else ""
        root = self.quota.root.get(victim.project)
        return (
            root is not None
            and root == self.quota.root.get(run.project)
            and self.borrowed_at_start(victim.project, t)
            and self.quota.within_nominal(run.project, t, request_amount(run))
        )
