"""The run lifecycle: what each event in a run's life means, as pure functions.

A function here takes what it needs of the run (the ``Run``, or ``RunState``: what the store
reads of its row) and the event, and returns what becomes of the run: a ``Transition`` (the
phase after, the attempt, the earliest re-admission, the event's kind and text, the reason the
run shows), or ``None`` when the event does not apply to a run in that phase. No I/O, no clock
(``now`` is an argument). The store reads the row in its transaction, asks here, and applies the
answer with compare-and-set (``state.transitions``, ``state.run_requests``); the controller asks
``job_end`` what a job's end means (``controller.poll``) and ``after_launch_failure`` what a
failed launch means (``controller.launch``).

The rules (each has its rows in ``tests/test_lifecycle.py``):
- Cancel wins. A run whose cancel was requested is never admitted; requeued (preempted, lost)
  or with its admission rolled back, it ends ``cancelled``; its job's end, whatever it was,
  ends it ``cancelled``, also when it was flagged for preemption too.
- A preemption is the scheduler's doing, not the run's fault: it does not use up the run's
  retries (counted attempts are its attempts less the preempted ones), and the run keeps its
  submit time (its place in the queue).
- A lost run (its job vanished, its node or backend is gone) is requeued as the next attempt,
  not admitted again before its backoff has passed, or fails once its counted attempts reach
  ``max_attempts`` (the run's own, else the config's).
- A job the controller was stopping (a cancel, a preemption, an overdue run) that vanishes is
  the stop it asked for, not a loss.
- Max runtime (``overdue``): the limit may be shortened after the launch (``mlops-gpu update
  --max-runtime``), and the backend only knows the one it was given, so the controller stops
  an overdue run as a cancel would; a run that ends overdue ends ``failed`` with the
  max-runtime reason, whoever stopped it and whatever its exit status (a run that traps the
  stop signal and exits 0 still ran out of time).
- A job stopped because its GPUs sat idle (``telemetry.stop_idle``) fails with that reason.
- A failed launch rolls the admission back (``pending``, the same attempt); the run fails once
  its launch failed ``retry.max_attempts`` times in a row.
- An ended run's end time is its job's own (it may have ended while the scheduler was down),
  never before its admission and never after ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from mlops_gpu.model.phase import ACTIVE_PHASES, TERMINAL_PHASES, Phase
from mlops_gpu.model.run import Run


class Keep(Enum):
    """A column a transition leaves as it was (``Transition.code``, ``Transition.reason``)."""

    KEEP = "keep"


KEEP = Keep.KEEP


@dataclass(frozen=True, slots=True)
class RunState:
    """What the lifecycle reads of a stored run."""

    phase: Phase
    attempt: int
    cancel_requested: bool = False
    held: bool = False
    #: how many of its attempts ended preempted (they do not use up its retries)
    preempted_attempts: int = 0


@dataclass(frozen=True, slots=True)
class Transition:
    """What becomes of a run: the store applies it with compare-and-set on the phase it read."""

    phase: Phase
    #: the event's kind and text
    kind: str
    event: str
    #: the attempt after (the next one when ``requeue``)
    attempt: int
    #: the attempt is over and the run waits as the next one (its placement, handle and start
    #: cleared); a move to pending without it undoes an admission that never launched
    requeue: bool = False
    #: a requeued run is not admitted again before this time (None: at once)
    not_before: float | None = None
    #: the reason code and text the run shows after (``KEEP``: as they were)
    code: str | Keep | None = KEEP
    reason: str | Keep = KEEP


# -- the store's side: the row it read, the event, the transition ----------------------------
def admissible(s: RunState) -> bool:
    """Whether a decision to admit the run still holds (held or cancelled meanwhile: no)."""
    return s.phase is Phase.PENDING and not s.cancel_requested and not s.held


def cancel(s: RunState) -> Transition | None:
    """A user's cancel of a pending run: cancelled at once. None otherwise: an active run is
    flagged (``flags_cancel``) and the controller stops it; an ended one stays as it is."""
    if s.phase is not Phase.PENDING:
        return None
    why = "cancelled by user"
    return Transition(Phase.CANCELLED, "cancelled", why, s.attempt, code=None, reason=why)


def flags_cancel(s: RunState) -> bool:
    """Whether a user's cancel flags the run (active, not flagged yet)."""
    return s.phase in ACTIVE_PHASES and not s.cancel_requested


def finish(s: RunState, phase: Phase, reason: str) -> Transition | None:
    """The run's job ended ``phase`` (succeeded, failed, cancelled); None if it already ended."""
    assert phase in TERMINAL_PHASES
    if s.phase in TERMINAL_PHASES:
        return None
    return Transition(phase, phase.value, reason, s.attempt, code=None, reason=reason)


def requeue(
    s: RunState,
    kind: Literal["preempted", "lost"],
    reason: str,
    max_attempts: int | None,
    now: float,
    backoff_s: float = 0.0,
) -> Transition | None:
    """A preempted or lost run: pending as attempt + 1 (not before ``backoff_s`` has passed),
    failed once its counted attempts reach ``max_attempts`` (None: no limit), cancelled if its
    cancel was requested. None if the run is not active."""
    if s.phase not in ACTIVE_PHASES:
        return None
    if s.cancel_requested:
        return Transition(Phase.CANCELLED, kind, f"{reason}; cancelled as requested", s.attempt)
    counted = s.attempt - s.preempted_attempts
    if max_attempts is not None and counted >= max_attempts:
        why = (
            f"{reason}; attempt {counted} of {max_attempts} (preemptions not counted), "
            "no retries left"
        )
        return Transition(Phase.FAILED, kind, why, s.attempt, reason=reason)
    nxt = s.attempt + 1
    return Transition(
        Phase.PENDING,
        kind,
        reason,
        nxt,
        requeue=True,
        not_before=now + backoff_s if backoff_s > 0 else None,
        code=kind,
        reason=f"{reason}; requeued as attempt {nxt}",
    )


def rollback(s: RunState, reason: str) -> Transition | None:
    """An admission whose launch failed (or never came): pending again with the same attempt,
    its GPUs free; cancelled if its cancel was requested meanwhile (it would never be admitted
    again). None if the run is not admitted."""
    if s.phase is not Phase.ADMITTED:
        return None
    if s.cancel_requested:
        why = f"{reason}; cancelled as requested"
        return Transition(
            Phase.CANCELLED, "cancelled", why, s.attempt, code=None, reason="cancelled by user"
        )
    return Transition(
        Phase.PENDING, "launch_failed", reason, s.attempt, code="launch_failed", reason=reason
    )


# -- the controller's side: what a job's end or a launch's failure means ---------------------
def overdue(run: Run, now: float | None) -> bool:
    """Whether ``run`` had held its GPUs for its max runtime at ``now`` (None: unknown, no)."""
    limit, start = run.spec.max_runtime_s, run.started_at
    return limit is not None and start is not None and now is not None and now - start >= limit


def ended_overdue(run: Run, exited_0: bool, finished_at: float | None, now: float) -> bool:
    """Whether ``run``, which ended (at ``finished_at`` by the backend's clock, None: unknown),
    ended for its max runtime: it had run that long when it ended, even if it trapped the
    controller's stop signal and exited 0. Without the job's own end time, an exit 0 seen only
    at ``now`` may have come before the limit: only a failure counts as overdue then."""
    if finished_at is not None:
        return overdue(run, finished_at)
    return not exited_0 and overdue(run, now)


@dataclass(frozen=True, slots=True)
class JobEnd:
    """A run's job that ended, as its backend reports it."""

    outcome: Literal["succeeded", "failed", "lost"]
    exit_code: int | None = None
    #: the backend's reason (``max_runtime``: it stopped the job at the limit it was given)
    reason: str | None = None
    #: by the backend's clock (None: unknown)
    finished_at: float | None = None
    #: the launcher stopped it because its GPUs sat idle (``telemetry.stop_idle``)
    stopped_idle: bool = False


@dataclass(frozen=True, slots=True)
class Requeue:
    """The run goes back to the queue (``requeue``) as the next attempt."""

    kind: Literal["preempted", "lost"]
    reason: str
    #: None: this end does not use up a retry (a preemption)
    max_attempts: int | None
    backoff_s: float


@dataclass(frozen=True, slots=True)
class Finish:
    """The run ends ``phase`` at ``at`` (``finish``)."""

    phase: Phase
    reason: str
    at: float


def job_end(
    run: Run, end: JobEnd, now: float, max_attempts: int, backoff_s: float
) -> Requeue | Finish:
    """What ``run``'s ended job means. ``max_attempts``: the config's default (the run's own
    limit wins); ``backoff_s``: the wait before its next attempt."""
    # a job we were stopping may simply be gone (a deleted Kubernetes Job): that is the stop
    # we asked for, not a loss; so is an overdue one, which the controller stops before
    # Kubernetes' own deadline: it ends failed below, not requeued
    stopping = run.preempt_requested or run.cancel_requested or overdue(run, end.finished_at or now)
    if end.outcome == "lost" and not stopping:
        why = end.reason or "the job vanished"
        return Requeue("lost", why, run.spec.max_attempts or max_attempts, backoff_s)
    if run.preempt_requested and not run.cancel_requested:
        return Requeue("preempted", "preempted", None, backoff_s)
    succeeded = end.outcome == "succeeded"
    if run.cancel_requested:
        phase, why = Phase.CANCELLED, "cancelled by user"
    elif end.reason == "max_runtime" or ended_overdue(run, succeeded, end.finished_at, now):
        phase = Phase.FAILED
        why = f"stopped after exceeding max_runtime {run.spec.max_runtime_s:g}s"
    elif succeeded:
        phase, why = Phase.SUCCEEDED, "exited 0"
    elif end.stopped_idle:
        phase, why = Phase.FAILED, f"stopped because its GPUs sat idle (exited {end.exit_code})"
    else:
        phase, why = Phase.FAILED, f"exited {end.exit_code}"
    at = max(now if end.finished_at is None else end.finished_at, run.admitted_at or 0.0)
    return Finish(phase, why, min(at, now))


def after_launch_failure(rolled_back: Phase, failures_in_a_row: int, max_attempts: int) -> Phase:
    """What a failed launch leaves, its admission rolled back to ``rolled_back`` (``rollback``):
    cancelled (its cancel was requested), failed (its launch failed ``max_attempts`` times in a
    row), else pending, to be admitted again."""
    if rolled_back is Phase.CANCELLED:
        return Phase.CANCELLED
    if failures_in_a_row >= max_attempts:
        return Phase.FAILED
    return Phase.PENDING
