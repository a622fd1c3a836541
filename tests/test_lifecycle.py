"""``model.lifecycle``: every transition of a run, as tables (the run's state, the event, what
becomes of it), and the same rules applied by a real store (cancel-wins races, retry limits).

The pure tables pin each rule; the store rows check that ``Store`` applies the lifecycle's
answer (phase, attempt, ``not_before``, reason) with compare-and-set, so a rule changed on either
side fails here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import pytest

from mlops_gpu.model import Phase, Placement
from mlops_gpu.model.cluster import NodeSlot
from mlops_gpu.model.lifecycle import (
    KEEP,
    Finish,
    JobEnd,
    Requeue,
    RunState,
    Transition,
    admissible,
    after_launch_failure,
    cancel,
    finish,
    flags_cancel,
    job_end,
    requeue,
    rollback,
)
from mlops_gpu.state import ConflictError, Store
from mlops_gpu.testing import make_run, make_spec

P, A, S, R = Phase.PENDING, Phase.ADMITTED, Phase.STARTING, Phase.RUNNING
OK, BAD, GONE = Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED
NOW = 1000.0


# -- admission and cancel -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (RunState(P, 1), True),
        (RunState(P, 1, cancel_requested=True), False),  # cancel wins over a decided admission
        (RunState(P, 1, held=True), False),
        (RunState(A, 1), False),
        (RunState(GONE, 1), False),
    ],
)
def test_admissible(state: RunState, expected: bool) -> None:
    assert admissible(state) is expected


@pytest.mark.parametrize(
    ("state", "moves", "flags"),
    [
        (RunState(P, 1), True, False),
        (RunState(A, 1), False, True),
        (RunState(S, 2), False, True),
        (RunState(R, 1), False, True),
        (RunState(R, 1, cancel_requested=True), False, False),  # flagged once
        (RunState(OK, 1), False, False),
        (RunState(GONE, 1), False, False),
    ],
)
def test_cancel(state: RunState, moves: bool, flags: bool) -> None:
    t = cancel(state)
    assert (t is not None) is moves
    assert flags_cancel(state) is flags
    if t is not None:
        assert t == Transition(
            GONE, "cancelled", "cancelled by user", 1, code=None, reason="cancelled by user"
        )


# -- finish -------------------------------------------------------------------------------------
@pytest.mark.parametrize("src", [A, S, R])
@pytest.mark.parametrize("dst", [OK, BAD, GONE])
def test_an_active_run_finishes(src: Phase, dst: Phase) -> None:
    t = finish(RunState(src, 3), dst, "why")
    assert t == Transition(dst, dst.value, "why", 3, code=None, reason="why")


@pytest.mark.parametrize("src", [OK, BAD, GONE])
def test_an_ended_run_does_not_finish_again(src: Phase) -> None:
    assert finish(RunState(src, 1), BAD, "why") is None


# -- requeue: preempted and lost, retries, cancel wins ------------------------------------------
Kind = Literal["preempted", "lost"]


@pytest.mark.parametrize(
    ("state", "kind", "max_attempts", "phase", "attempt", "event"),
    [
        # a loss uses up a retry: attempt 1 of 3 -> attempt 2; attempt 3 of 3 fails
        (RunState(R, 1), "lost", 3, P, 2, "gone"),
        (RunState(R, 2), "lost", 3, P, 3, "gone"),
        (
            RunState(R, 3),
            "lost",
            3,
            BAD,
            3,
            "gone; attempt 3 of 3 (preemptions not counted), no retries left",
        ),
        # preempted attempts are not counted: attempt 3 after 2 preemptions is the first counted
        (RunState(R, 3, preempted_attempts=2), "lost", 2, P, 4, "gone"),
        (
            RunState(R, 4, preempted_attempts=2),
            "lost",
            2,
            BAD,
            4,
            "gone; attempt 2 of 2 (preemptions not counted), no retries left",
        ),
        # a preemption passes no limit (None): never out of retries
        (RunState(R, 9, preempted_attempts=8), "preempted", None, P, 10, "gone"),
        (RunState(A, 1), "preempted", None, P, 2, "gone"),
        (
            RunState(S, 1),
            "lost",
            1,
            BAD,
            1,
            "gone; attempt 1 of 1 (preemptions not counted), no retries left",
        ),
        # cancel wins over a requeue, even with retries left or none
        (
            RunState(R, 1, cancel_requested=True),
            "preempted",
            None,
            GONE,
            1,
            "gone; cancelled as requested",
        ),
        (
            RunState(R, 5, cancel_requested=True),
            "lost",
            1,
            GONE,
            5,
            "gone; cancelled as requested",
        ),
    ],
)
def test_requeue(
    state: RunState,
    kind: Kind,
    max_attempts: int | None,
    phase: Phase,
    attempt: int,
    event: str,
) -> None:
    t = requeue(state, kind, "gone", max_attempts, NOW, backoff_s=30.0)
    assert t is not None
    assert (t.phase, t.attempt, t.kind, t.event) == (phase, attempt, kind, event)
    assert t.requeue is (phase is P)
    if phase is P:
        assert t.not_before == NOW + 30.0
        assert (t.code, t.reason) == (kind, f"gone; requeued as attempt {attempt}")
    elif phase is BAD:
        assert (t.code, t.reason) == (KEEP, "gone")
    else:
        assert (t.code, t.reason) == (KEEP, KEEP)


def test_requeue_without_backoff_is_admissible_at_once() -> None:
    t = requeue(RunState(R, 1), "lost", "gone", 3, NOW, backoff_s=0.0)
    assert t is not None and t.not_before is None


@pytest.mark.parametrize("src", [P, OK, BAD, GONE])
def test_only_active_runs_requeue(src: Phase) -> None:
    assert requeue(RunState(src, 1), "lost", "gone", 3, NOW) is None


# -- rollback of an admission, and what a failed launch leaves ----------------------------------
@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (
            RunState(A, 2),
            Transition(P, "launch_failed", "boom", 2, code="launch_failed", reason="boom"),
        ),
        (
            RunState(A, 2, cancel_requested=True),
            Transition(
                GONE,
                "cancelled",
                "boom; cancelled as requested",
                2,
                code=None,
                reason="cancelled by user",
            ),
        ),
        (RunState(P, 1), None),
        (RunState(S, 1), None),
        (RunState(R, 1), None),
        (RunState(GONE, 1), None),
    ],
)
def test_rollback(state: RunState, expected: Transition | None) -> None:
    assert rollback(state, "boom") == expected


@pytest.mark.parametrize(
    ("rolled_back", "failures", "max_attempts", "after"),
    [
        (P, 1, 3, P),
        (P, 2, 3, P),
        (P, 3, 3, BAD),  # the third launch failure in a row fails it
        (P, 1, 1, BAD),
        (GONE, 1, 3, GONE),  # cancel wins
        (GONE, 5, 3, GONE),
    ],
)
def test_after_launch_failure(rolled_back: Phase, failures: int, max_attempts: int,
                              after: Phase) -> None:  # fmt: skip
    assert after_launch_failure(rolled_back, failures, max_attempts) is after


# -- a job's end ------------------------------------------------------------------------------
def _run(**kw: Any) -> Any:
    base: dict[str, Any] = {"phase": R, "admitted_at": 100.0, "started_at": 110.0}
    return make_run("r", **{**base, **kw})


END_OK = JobEnd("succeeded", 0, finished_at=900.0)
END_FAIL = JobEnd("failed", 3, finished_at=900.0)
END_LOST = JobEnd("lost", reason="node n1 lost")


@pytest.mark.parametrize(
    ("run", "end", "expected"),
    [
        (_run(), END_OK, Finish(OK, "exited 0", 900.0)),
        (_run(), END_FAIL, Finish(BAD, "exited 3", 900.0)),
        (
            _run(),
            replace(END_FAIL, stopped_idle=True),
            Finish(BAD, "stopped because its GPUs sat idle (exited 3)", 900.0),
        ),
        # lost: requeued with the config's limit, or the run's own
        (_run(), END_LOST, Requeue("lost", "node n1 lost", 3, 20.0)),
        (_run(max_attempts=7), END_LOST, Requeue("lost", "node n1 lost", 7, 20.0)),
        (_run(), JobEnd("lost"), Requeue("lost", "the job vanished", 3, 20.0)),
        # preempted: requeued, no retry used up; whatever the job's exit
        (_run(preempt_requested=True), END_FAIL, Requeue("preempted", "preempted", None, 20.0)),
        (_run(preempt_requested=True), END_LOST, Requeue("preempted", "preempted", None, 20.0)),
        (_run(preempt_requested=True), END_OK, Requeue("preempted", "preempted", None, 20.0)),
        # cancel wins: over an exit 0, a loss (the stop we asked for), a preemption
        (_run(cancel_requested=True), END_OK, Finish(GONE, "cancelled by user", 900.0)),
        (_run(cancel_requested=True), END_LOST, Finish(GONE, "cancelled by user", NOW)),
        (
            _run(cancel_requested=True, preempt_requested=True),
            END_FAIL,
            Finish(GONE, "cancelled by user", 900.0),
        ),
        # overtime: failed with the max-runtime reason, whatever the exit; a vanished overdue
        # job is the controller's stop, not a loss
        (
            _run(max_runtime_s=60.0),
            END_OK,
            Finish(BAD, "stopped after exceeding max_runtime 60s", 900.0),
        ),
        (
            _run(max_runtime_s=60.0),
            END_LOST,
            Finish(BAD, "stopped after exceeding max_runtime 60s", NOW),
        ),
        (
            _run(max_runtime_s=5000.0),
            JobEnd("failed", 137, "max_runtime", 900.0),
            Finish(BAD, "stopped after exceeding max_runtime 5000s", 900.0),
        ),
        (_run(max_runtime_s=5000.0), END_OK, Finish(OK, "exited 0", 900.0)),
        # the end time: the job's own, never before the admission, never after now
        (_run(), JobEnd("succeeded", 0), Finish(OK, "exited 0", NOW)),
        (_run(), replace(END_OK, finished_at=50.0), Finish(OK, "exited 0", 100.0)),
        (_run(), replace(END_OK, finished_at=NOW + 60), Finish(OK, "exited 0", NOW)),
    ],
)
def test_job_end(run: Any, end: JobEnd, expected: Requeue | Finish) -> None:
    assert job_end(run, end, NOW, max_attempts=3, backoff_s=20.0) == expected


# -- the store applies the lifecycle ------------------------------------------------------------
PLACE = Placement("local", "a100-80gb", (NodeSlot("n1", ("0",)),))


def _active(store: Store, max_attempts: int | None = None) -> str:
    run = store.submit(make_spec("p", 1, name="x", max_attempts=max_attempts), now=1.0)
    assert store.admit(run.id, PLACE, now=2.0)
    store.set_handle(run.id, "h1", Phase.RUNNING, now=3.0)
    return run.id


def test_store_requeue_lost_then_out_of_retries(store: Store) -> None:
    rid = _active(store)
    assert store.requeue(rid, "lost", "gone", 2, now=10.0, backoff_s=5.0) is P
    got = store.get(rid)
    assert got is not None
    assert (got.attempt, got.not_before, got.placement, got.handle) == (2, 15.0, None, None)
    assert (got.reason_code, got.reason) == ("lost", "gone; requeued as attempt 2")
    assert store.admit(rid, PLACE, now=20.0)
    store.set_handle(rid, "h2", Phase.RUNNING, now=21.0)
    assert store.requeue(rid, "lost", "gone", 2, now=30.0) is BAD
    got = store.get(rid)
    assert got is not None and (got.phase, got.attempt, got.reason) == (BAD, 2, "gone")
    assert got.finished_at == 30.0


def test_store_preemptions_do_not_use_up_retries(store: Store) -> None:
    rid = _active(store)
    for n in range(3):
        assert store.requeue(rid, "preempted", "preempted", None, now=10.0 + n) is P
        assert store.admit(rid, PLACE, now=10.5 + n)
    # attempt 4 after three preemptions is the first counted: retried; attempt 5 is the 2nd
    assert store.requeue(rid, "lost", "gone", 2, now=20.0) is P
    assert store.admit(rid, PLACE, now=21.0)
    assert store.requeue(rid, "lost", "gone", 2, now=22.0) is BAD


@pytest.mark.parametrize("kind", ["preempted", "lost"])
def test_store_cancel_wins_over_requeue(store: Store, kind: Kind) -> None:
    rid = _active(store)
    assert store.request_cancel(rid, now=5.0) is R  # flagged: the controller stops it
    assert store.requeue(rid, kind, "gone", 3, now=6.0) is GONE
    got = store.get(rid)
    assert got is not None and (got.phase, got.attempt, got.finished_at) == (GONE, 1, 6.0)
    assert [e.reason for e in store.events(rid)][-1] == "gone; cancelled as requested"


def test_store_cancel_wins_over_rollback_and_admission(store: Store) -> None:
    run = store.submit(make_spec("p", 1, name="x"), now=1.0)
    assert store.admit(run.id, PLACE, now=2.0)
    assert store.request_cancel(run.id, now=3.0) is A
    assert store.rollback_admission(run.id, "boom", now=4.0) is GONE
    got = store.get(run.id)
    assert got is not None and (got.phase, got.reason) == (GONE, "cancelled by user")
    with pytest.raises(ConflictError):
        store.rollback_admission(run.id, "boom", now=5.0)


def test_store_rollback_keeps_the_attempt(store: Store) -> None:
    run = store.submit(make_spec("p", 1, name="x"), now=1.0)
    assert store.admit(run.id, PLACE, now=2.0)
    assert store.rollback_admission(run.id, "boom", now=3.0) is P
    got = store.get(run.id)
    assert got is not None
    assert (got.attempt, got.placement, got.admitted_at) == (1, None, None)
    assert (got.reason_code, got.reason) == ("launch_failed", "boom")


def test_store_finish_once_and_requeue_only_active(store: Store) -> None:
    rid = _active(store)
    assert store.finish(rid, OK, "exited 0", exit_code=0, now=9.0)
    assert not store.finish(rid, BAD, "again", now=10.0)
    with pytest.raises(ConflictError):
        store.requeue(rid, "lost", "gone", 3, now=11.0)
    got = store.get(rid)
    assert got is not None and (got.phase, got.reason, got.exit_code) == (OK, "exited 0", 0)


def test_store_cancel_of_a_pending_run(store: Store) -> None:
    run = store.submit(make_spec("p", 1, name="x"), now=1.0)
    assert store.request_cancel(run.id, now=2.0) is GONE
    assert store.request_cancel(run.id, now=3.0) is GONE  # an ended run stays as it is
    got = store.get(run.id)
    assert got is not None and (got.reason, got.finished_at) == ("cancelled by user", 2.0)
