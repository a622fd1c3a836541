"""``CycleBooks``: what one scheduling cycle (``cycle.Cycle``) holds and the primitives that
write it. The cycle's parts are layered classes, each in its own module, each adding one step of
``policy``'s numbered steps on top of the one below:
``CycleBooks`` (this) -> ``cycle_victims.VictimRules`` (who may be a victim) ->
``cycle_reserve.ReservationHold`` (the anchor's EASY reservation) ->
``cycle_explain.Explaining`` (reasons and ETAs) -> ``cycle.Cycle`` (order, fit, preempt).

Invariants:
- The books are the cycle's ``State`` (``cap``, ``quota``: shared with the state, changed in
  place) plus what the cycle decided: ``admissions``, ``preemptions``, ``reasons``. Within a
  cycle devices and quota change only through ``_admit`` (and a preemption's victims giving
  back what they hold, ``Cycle._preempt``), so usage only grows between evictions.
- ``_level_of``: a project whose budget is spent with ``action: wait`` has no level (its runs
  wait); with ``action: lower`` its runs are served at the lower class, never a higher one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from mlops_gpu.core.backfill import Reservation
from mlops_gpu.core.decision import Admission, PendingReason, Preemption, ReasonCode
from mlops_gpu.core.fairshare import Shares, budget_exceeded
from mlops_gpu.core.queue_keys import ShapeKey
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.core.state import State
from mlops_gpu.model import Placement, Run

#: ``Cycle._quota_term``: holders, their usage, the limit, their runs' ends, GPUs released by each
QuotaTerm = tuple[Collection[str], float, float | None, list[tuple[float, float]], list[float]]


class CycleBooks:
    """A cycle's books: its state, what it decided, and its per-cycle caches."""

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
        self._full: Snapshot | None = None
        self.cap, self.quota = state.cap, state.quota
        self.shares = Shares(self.snap, self.cap.used, state.capacity_by_type)
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.reasons: dict[str, PendingReason] = {}
        self.going: set[str] = set(state.going)
        self._reservation: Reservation | None = None
        self._reserved = False  # whether the anchor's reservation has been worked out
        self.anchor: str | None = None  # the run the reservation is for (``anchor.anchor``)
        self.blocked_projects: dict[str, str] = {}
        #: strict FIFO: the projects whose head had to borrow (the borrowing passes serve them)
        self._deferred: set[str] = set()
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
        self._running_now: list[Run] = []

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

    def _level(self, run: Run) -> int:
        return self._level_of(run.project, self.snap.priority_of(run)) or 0

    def room(self, project: str, gpu_type: str) -> float:
        """The most of ``gpu_type`` the project could add without a certain quota problem:
        its nominal left, or, while its cohort tree still lends, up to nominal plus its
        borrowing limit (unbounded without one)."""
        q = self.quota.quota(project, gpu_type)
        used = self.quota.used[(project, gpu_type)]
        root = self.quota.root.get(project)
        if root is None or self._cohort_exhausted(root, gpu_type):
            return q.nominal - used
        if q.borrowing_limit is None:
            return float("inf")
        return q.nominal + q.borrowing_limit - used

    def _cohort_exhausted(self, root: str, gpu_type: str) -> bool:
        """Whether the tree lends nothing more of ``gpu_type``."""
        borrowed, lendable = self.quota.cohort_sums(root, gpu_type)
        return lendable - borrowed <= 1e-9

    def _admit(self, run: Run, placement: Placement) -> None:
        if self._reservation is not None and self._reservation.run_id == run.id:
            self._reservation = None  # it started: nothing more to hold for it
        self.cap.take(run.project, placement, run.request.gpu_types)
        self.shares.add(run.project, placement.gpu_type, placement.gpu_amount)
        self.admissions.append(Admission(run.id, placement))

    def _wait(self, run: Run, code: ReasonCode, reason: str, eta: float | None = None) -> None:
        self.reasons[run.id] = PendingReason(run.id, code, reason, eta)
