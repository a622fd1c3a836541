"""The core's only output: which runs to admit where, which to preempt, and why the rest wait.

Reason codes are a stable contract (``reason_code`` in the CLI's JSON); sentences are for people.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from mlops_gpu.model import Placement


class ReasonCode(str, Enum):
    #: Some node could host it, but not enough GPUs are free now.
    NO_CAPACITY = "no_capacity"
    #: Free GPUs exist, but taking them would delay the reservation of an earlier blocked run.
    RESERVED = "reserved"
    #: The project has no quota left for the GPU type (nominal + borrowing limit or cohort).
    QUOTA = "quota"
    #: Runs are being preempted to make room for it; it starts when they have exited. (The core
    #: admits a preemptor in the decision that chooses its victims, so it never gives this
    #: reason itself; the controller may, for an admitted run waiting for its victims.)
    PREEMPTING = "preempting"
    #: Its project's GPU-hour or money budget for the window is spent.
    BUDGET = "budget"
    #: Requeued after a preemption or loss, it waits out its backoff.
    BACKOFF = "backoff"
    #: No node of any acceptable type and backend could ever host it.
    UNSCHEDULABLE = "unschedulable"
    #: Strict FIFO: an older run of the same project is blocked and holds its place.
    QUEUED_BEHIND = "queued_behind"
    #: The run's project or priority class is not (or no longer) in the config.
    INVALID = "invalid"
    #: Held by a user (``submit --hold``, ``hold``) until ``release``.
    HELD = "held"
    #: Its begin time (``--begin``) is still to come; the ETA is that time.
    BEGIN_TIME = "begin_time"
    #: It waits for runs it depends on (``--after...``) to end as it asked; the reason names
    #: them. One whose dependency can never be met is cancelled (``Decision.doomed``).
    DEPENDENCY = "dependency"
    #: Its array has as many elements running as its ``%N`` limit allows.
    ARRAY_LIMIT = "array_limit"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Admission:
    run_id: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class Preemption:
    run_id: str
    reason: str
    signal: str
    grace_s: float
    #: The pending run this makes room for (admitted in the same decision).
    for_run: str = ""
    #: GPU-seconds of work the victim loses: since its last checkpoint, else since it started
    #: (``preempt.lost_gpu_s``).
    lost_gpu_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PendingReason:
    run_id: str
    reason_code: ReasonCode
    reason: str
    eta: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    pending: tuple[PendingReason, ...] = ()
    #: Pending runs whose dependencies can never be met (code ``dependency``): the controller
    #: cancels them with the reason. Reported by every decision while they are still pending.
    doomed: tuple[PendingReason, ...] = ()
