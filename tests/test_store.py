"""The state store against both backends: SQLite and a real PostgreSQL (``pg_store_url``)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from mlops_gpu.model import Phase, Run
from mlops_gpu.model.phase import can_transition
from mlops_gpu.model.public import run_to_public
from mlops_gpu.state import ConflictError, Event, LeaderLock, Store, UsageRow
from mlops_gpu.state.migrations import LATEST
from mlops_gpu.state.schema import runs, schema_version
from mlops_gpu.state.store import ETA_SLACK_S
from mlops_gpu.testing.builders import make_spec, placed

T0 = 1_714_000_000.25  # a realistic epoch time: float4 or REAL truncation would show
P, A, S, R = Phase.PENDING, Phase.ADMITTED, Phase.STARTING, Phase.RUNNING
OK, FAIL, CANC = Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED
PL = placed("node-a", ["0", "1"])  # 2 GPUs of a100-80gb on the local backend


def submit(store: Store, name: str = "job", project: str = "p", now: float = T0) -> str:
    return store.submit(make_spec(project, 2, name=name), now=now).id


def drive(store: Store, run_id: str, phase: Phase, now: float = T0) -> None:
    """Move a freshly submitted run to ``phase`` along the ordinary path."""
    if phase is CANC:
        assert store.request_cancel(run_id, now=now + 1) is CANC
    if phase not in (P, CANC):
        assert store.admit(run_id, PL, now=now + 10)
    if phase not in (P, CANC, A):
        store.set_handle(run_id, "h-1", S, now=now + 11)
    if phase in (R, OK, FAIL):
        assert store.mark_running(run_id, now=now + 12)
    if phase in (OK, FAIL):
        assert store.finish(run_id, phase, "done", exit_code=0, now=now + 110)
    assert get(store, run_id).phase is phase


def get(store: Store, run_id: str) -> Run:
    run = store.get(run_id)
    assert run is not None
    return run


def attrs(obj: Any, names: str) -> tuple[Any, ...]:
    return tuple(getattr(obj, n) for n in names.split())


def new_run(store: Store, phase: Phase | str, name: str = "job") -> str:
    """A run in ``phase``; "pending+cancel" is a pending run whose cancel flag is set (set here
    by SQL: request_cancel cancels a pending run at once)."""
    run_id = submit(store, name)
    if phase == "pending+cancel":
        with store.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.id == run_id).values(cancel_requested=True))
        return run_id
    drive(store, run_id, Phase(phase))
    return run_id


def snapshot(store: Store, run_id: str) -> tuple[Any, ...]:
    return store.get(run_id), store.events(run_id), store.usage()


# -- submit and read ---------------------------------------------------------------------------
def test_submit_is_pending_attempt_one_with_a_submitted_event(store: Store) -> None:
    spec = make_spec("p", 2, name="train-1", command=("python", "train.py"))
    run = store.submit(spec, now=T0)
    assert (run.phase, run.attempt, run.submitted_at, run.spec) == (Phase.PENDING, 1, T0, spec)
    assert (run.placement, run.admitted_at, run.cancel_requested) == (None, None, False)
    assert store.get(run.id) == run
    assert store.events(run.id) == [Event(run.id, T0, "submitted", None, "pending", 1, "submitted")]
    assert store.get("r-missing") is None


LIST_CASES = [
    ({}, ["a1", "b1", "a2", "b2", "a3"]),
    ({"newest_first": True}, ["a3", "b2", "a2", "b1", "a1"]),
    ({"project": "a"}, ["a1", "a2", "a3"]),
    ({"project": "b", "newest_first": True}, ["b2", "b1"]),
    ({"limit": 2}, ["a1", "b1"]),
    ({"newest_first": True, "limit": 1}, ["a3"]),
    ({"phases": [Phase.PENDING]}, ["a1", "b1", "b2", "a3"]),
    ({"phases": [Phase.ADMITTED]}, ["a2"]),
    ({"phases": [Phase.PENDING], "project": "a", "newest_first": True}, ["a3", "a1"]),
    ({"phases": []}, []),
    ({"project": "zzz"}, []),
]


@pytest.mark.parametrize(("kwargs", "names"), LIST_CASES)
def test_list_runs_and_count(store: Store, kwargs: dict[str, Any], names: list[str]) -> None:
    ids = {n: submit(store, n, project=n[0], now=T0) for n in ["a1", "b1", "a2", "b2", "a3"]}
    assert len(set(ids.values())) == 5
    assert store.admit(ids["a2"], PL, now=T0 + 1)
    assert store.count() == 5
    assert [r.spec.name for r in store.list_runs(**kwargs)] == names
    seqs = [r.seq for r in store.list_runs()]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5


# -- admission ---------------------------------------------------------------------------------
def test_admit_stores_the_placement_and_names_the_node(store: Store) -> None:
    run_id = submit(store)
    store.set_reasons([(run_id, "capacity", "no free GPUs", 5.0)])
    assert store.admit(run_id, PL, now=T0 + 10) is True
    run = get(store, run_id)
    assert attrs(run, "phase placement admitted_at") == (Phase.ADMITTED, PL, T0 + 10)
    assert attrs(run, "reason_code reason eta") == (None, None, None)
    last = store.events(run_id)[-1]
    assert attrs(last, "kind phase_from phase_to") == ("admitted", "pending", "admitted")
    assert "node-a" in last.reason


def test_submit_many_is_one_revision_with_an_event_each(store: Store) -> None:
    rev = store.revision()
    specs = [make_spec("p", 2, name=f"job{i}") for i in range(3)]
    runs = store.submit_many(specs, now=T0)
    assert store.revision() == rev + 1  # one bump for the batch
    assert [r.spec.name for r in runs] == ["job0", "job1", "job2"]
    assert len({r.id for r in runs}) == 3 and {r.phase for r in runs} == {Phase.PENDING}
    for r in runs:
        assert [(e.kind, e.phase_to) for e in store.events(r.id)] == [("submitted", "pending")]
        assert get(store, r.id) == r
    assert store.submit_many([], now=T0) == [] and store.revision() == rev + 1


def test_admit_many_is_one_revision_with_an_event_each_and_skips_cancelled(store: Store) -> None:
    ids = [submit(store, "job0"), new_run(store, "pending+cancel", "job1"), submit(store, "job2")]
    rev = store.revision()
    assert store.admit_many([(i, PL) for i in ids], now=T0 + 10) == [True, False, True]
    assert store.revision() == rev + 1  # one bump for the batch
    assert [get(store, i).phase for i in ids] == [Phase.ADMITTED, Phase.PENDING, Phase.ADMITTED]
    assert get(store, ids[2]).placement == PL
    changed, _ = store.changed_since(rev)
    assert {r.id for r in changed} == {ids[0], ids[2]}
    for i in (ids[0], ids[2]):
        assert [e.kind for e in store.events(i)].count("admitted") == 1
    store.set_handles([(ids[0], "h0"), (ids[2], "h2")], Phase.STARTING, now=T0 + 11)
    assert [attrs(get(store, i), "phase handle") for i in (ids[0], ids[2])] == [
        (Phase.STARTING, "h0"), (Phase.STARTING, "h2")]  # fmt: skip


def test_a_batch_with_an_illegal_move_writes_nothing(store: Store) -> None:
    ok, done = submit(store, "ok"), submit(store, "done")
    drive(store, done, Phase.SUCCEEDED)
    assert store.admit(ok, PL, now=T0 + 10)
    before = snapshot(store, ok)
    with pytest.raises(ConflictError):  # a finished run cannot start
        store.set_handles([(ok, "h"), (done, "h2")], Phase.STARTING, now=T0 + 11)
    assert snapshot(store, ok) == before
    with pytest.raises(KeyError, match="nope"):
        store.admit_many([("nope", PL)])


# -- start, finish and usage -------------------------------------------------------------------
@pytest.mark.parametrize("end", [Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED])
def test_finish_writes_exactly_one_usage_row(store: Store, end: Phase) -> None:
    run_id = submit(store)
    assert store.admit(run_id, PL, now=T0 + 10)
    store.set_handle(run_id, "pid-42", Phase.STARTING, now=T0 + 11)
    assert attrs(get(store, run_id), "phase handle started_at") == (S, "pid-42", None)
    assert store.mark_running(run_id, now=T0 + 12)
    assert get(store, run_id).started_at == T0 + 12
    assert store.finish(run_id, end, "the end", exit_code=3, now=T0 + 110) is True
    assert attrs(get(store, run_id), "phase finished_at exit_code") == (end, T0 + 110, 3)
    row = UsageRow(run_id, 1, "p", "tester", "a100-80gb", "local", 2, T0 + 10, T0 + 110, 200, end,
                   queued_at=T0)  # fmt: skip
    assert store.usage() == [row]
    assert store.usage(since=T0 + 110) == [row] and store.usage(since=T0 + 111) == []
    before = snapshot(store, run_id)
    assert store.finish(run_id, Phase.FAILED, "again", now=T0 + 200) is False
    assert store.mark_running(run_id, now=T0 + 201) is False
    assert snapshot(store, run_id) == before


# -- rollback and requeue ----------------------------------------------------------------------
def test_rollback_admission_returns_the_run_to_pending(store: Store) -> None:
    run_id = new_run(store, Phase.ADMITTED)
    store.rollback_admission(run_id, "image pull failed", now=T0 + 20)
    run = get(store, run_id)
    assert attrs(run, "phase placement admitted_at attempt") == (Phase.PENDING, None, None, 1)
    assert attrs(run, "reason_code reason") == ("launch_failed", "image pull failed")
    ev = store.events(run_id)[-1]
    assert attrs(ev, "time kind phase_from phase_to") == (T0 + 20, "launch_failed", A, P)
    assert store.usage() == []
    assert store.admit(run_id, PL, now=T0 + 30)


def test_rollback_of_a_cancel_requested_admission_cancels_it(store: Store) -> None:
    run_id = new_run(store, Phase.ADMITTED)
    assert store.request_cancel(run_id) is Phase.ADMITTED
    store.rollback_admission(run_id, "launch failed", now=T0 + 20)
    # today: pending with cancel_requested set, which admit refuses forever
    assert get(store, run_id).phase is Phase.CANCELLED


REQUEUE_CASES = [
    # kind, from, max_attempts, cancel first, -> phase, attempt after
    ("preempted", Phase.RUNNING, 3, False, Phase.PENDING, 2),
    ("lost", Phase.RUNNING, 3, False, Phase.PENDING, 2),
    ("lost", Phase.ADMITTED, 3, False, Phase.PENDING, 2),
    ("preempted", Phase.STARTING, 3, False, Phase.PENDING, 2),
    ("preempted", Phase.RUNNING, 1, False, Phase.FAILED, 1),
    ("lost", Phase.RUNNING, 1, False, Phase.FAILED, 1),
    ("preempted", Phase.RUNNING, 3, True, Phase.CANCELLED, 1),
    ("lost", Phase.STARTING, 1, True, Phase.CANCELLED, 1),
]


@pytest.mark.parametrize(("kind", "src", "max_attempts", "cancel", "dst", "attempt"), REQUEUE_CASES)
def test_requeue(
    store: Store, kind: str, src: Phase, max_attempts: int, cancel: bool, dst: Phase, attempt: int
) -> None:
    run_id = new_run(store, src)
    store.mark_preempting(run_id, "make room")
    if cancel:
        store.request_cancel(run_id)
    assert store.requeue(run_id, kind, "node died", max_attempts, now=T0 + 60) is dst
    run = get(store, run_id)
    assert attrs(run, "phase attempt") == (dst, attempt)
    [u] = store.usage()
    assert attrs(u, "outcome attempt start end gpu_seconds") == (kind, 1, T0 + 10, T0 + 60, 100)
    ev = store.events(run_id)[-1]
    assert attrs(ev, "kind phase_from phase_to attempt") == (kind, src, dst, attempt)
    if dst is Phase.PENDING:
        assert attrs(run, "placement admitted_at started_at handle") == (None,) * 4
        assert attrs(run, "reason_code preempt_requested") == (kind, False)
    else:
        assert run.finished_at == T0 + 60


def test_requeue_counts_attempts_until_retries_are_spent(store: Store) -> None:
    run_id = submit(store)
    for n in (1, 2, 3):
        assert store.admit(run_id, PL, now=T0 + 100 * n)
        expected = Phase.PENDING if n < 3 else Phase.FAILED
        assert store.requeue(run_id, "lost", "gone", 3, now=T0 + 100 * n + 7) is expected
    assert attrs(get(store, run_id), "phase attempt") == (Phase.FAILED, 3)
    assert [(u.attempt, u.gpu_seconds) for u in store.usage()] == [(1, 14.0), (2, 14.0), (3, 14.0)]


def test_preemptions_do_not_use_up_retries(store: Store) -> None:
    """README and the starter config say preemptions do not count toward max_attempts: two
    preemptions then losses fail the run only at its third loss (attempt 5), not at attempt 3."""
    run_id = submit(store)
    kinds = ["preempted", "preempted", "lost", "lost", "lost"]
    for n, kind in enumerate(kinds, start=1):
        assert store.admit(run_id, PL, now=T0 + 100 * n)
        expected = Phase.FAILED if n == len(kinds) else Phase.PENDING
        assert store.requeue(run_id, kind, "gone", None if kind == "preempted" else 3,
                             now=T0 + 100 * n + 7) is expected, n  # fmt: skip
    run = get(store, run_id)
    assert attrs(run, "phase attempt") == (Phase.FAILED, 5)
    assert "attempt 3 of 3" in store.events(run_id)[-1].reason


# -- user requests -----------------------------------------------------------------------------
def test_cancel_of_a_pending_run_is_immediate(store: Store) -> None:
    run_id, other = submit(store), submit(store)
    assert store.request_cancel(run_id, now=T0 + 3) is CANC
    assert attrs(get(store, run_id), "phase finished_at") == (CANC, T0 + 3)
    assert store.events(run_id)[-1].phase_to == "cancelled"
    assert store.finish(other, CANC, "gone", now=T0 + 5)  # the controller's way
    assert get(store, other).phase is CANC and store.usage() == []  # no GPUs held, no usage


def test_a_cancelled_or_failed_pending_run_keeps_no_eta(store: Store) -> None:
    """A run that ends has no estimated start: the ETA of its last explanation goes with it
    (a cancelled run showed its stale ETA in ``status``)."""
    a, b = submit(store, "a"), submit(store, "b")
    assert store.set_reasons([(a, "capacity", "no GPUs", T0 + 900), (b, "quota", "q", T0 + 60)])
    assert store.request_cancel(a, now=T0 + 3) is CANC
    assert store.finish(b, FAIL, "invalid", now=T0 + 4)
    for r in (a, b):
        assert get(store, r).eta is None
        assert run_to_public(get(store, r))["eta"] is None


@pytest.mark.parametrize("phase", [Phase.ADMITTED, Phase.STARTING, Phase.RUNNING])
def test_cancel_of_an_active_run_sets_the_flag_once(store: Store, phase: Phase) -> None:
    run_id = new_run(store, phase)
    n = len(store.events(run_id))
    for _ in range(2):
        assert store.request_cancel(run_id, now=T0 + 50) is phase
        assert attrs(get(store, run_id), "phase cancel_requested") == (phase, True)
        evs = store.events(run_id)
        assert len(evs) == n + 1
        assert attrs(evs[-1], "kind phase_from phase_to") == ("cancel_requested", None, None)


def test_set_reasons_touches_only_changed_pending_runs(store: Store) -> None:
    a, b, c = (submit(store, n) for n in "abc")
    assert store.admit(c, PL)
    assert store.set_reasons([]) == 0
    ra, rb = (a, "quota", "over quota", None), (b, "capacity", "no GPUs", 50.0)
    rs = [ra, rb, (c, "quota", "x", None), ("r-missing", "quota", "x", None)]
    assert store.set_reasons(rs) == 2  # c is admitted, r-missing unknown
    assert store.set_reasons(rs) == 0
    assert store.set_reasons([ra, (b, "capacity", "no GPUs", 60.0)]) == 1
    got = {r.id: attrs(r, "reason_code reason eta") for r in store.list_runs()}
    assert got == {a: ra[1:], b: ("capacity", "no GPUs", 60.0), c: (None, None, None)}
    # an ETA that only drifts (by less than ETA_SLACK_S) is not rewritten; a real move is
    assert store.set_reasons([(b, "capacity", "no GPUs", 60.0 + ETA_SLACK_S - 0.5)]) == 0
    assert store.set_reasons([(b, "capacity", "no GPUs", 60.0 + ETA_SLACK_S)]) == 1
    assert store.set_reasons([(b, "capacity", "no GPUs", None)]) == 1


def test_change_feed_sees_every_run_change_but_reasons(store: Store) -> None:
    live, rev0 = store.live_runs()
    assert live == []
    a, b = submit(store, "a"), submit(store, "b")
    changed, rev1 = store.changed_since(rev0)
    assert [r.id for r in changed] == [a, b] and rev1 > rev0
    assert store.changed_since(rev1) == ([], rev1)
    store.set_reasons([(a, "quota", "over quota", None)])
    assert store.changed_since(rev1) == ([], rev1)  # reasons are not changes
    assert store.admit(a, PL)
    store.set_handle(a, "h-1", Phase.STARTING)
    store.request_cancel(b)
    changed, rev2 = store.changed_since(rev1)
    assert [(r.id, r.phase) for r in changed] == [(a, Phase.STARTING), (b, Phase.CANCELLED)]
    live, rev = store.live_runs()
    assert [r.id for r in live] == [a] and rev == rev2


# -- refused requests change nothing -----------------------------------------------------------
Case = tuple[str, Phase | str, Callable[[Store, str], Any], Any]


def cases(name: str, action: Callable[[Store, str], Any], expected: Any, *on: Any) -> list[Case]:
    """``action`` on a run in each phase of ``on`` gives ``expected`` ("same": that phase)."""
    return [(f"{name}-{p}", p, action, p if expected == "same" else expected) for p in on]


NO_OPS = [
    *cases("admit", lambda s, r: s.admit(r, PL), False, A, S, R, OK, FAIL, CANC, "pending+cancel"),
    *cases("rollback", lambda s, r: s.rollback_admission(r, "x"), ConflictError, P, S, R, OK, CANC),
    *cases("requeue", lambda s, r: s.requeue(r, "lost", "x", 5), ConflictError, P, OK, FAIL, CANC),
    *cases("cancel", lambda s, r: s.request_cancel(r), "same", OK, FAIL, CANC),
    *cases("mark_running", lambda s, r: s.mark_running(r), False, P, R, OK, CANC),
    *cases("finish", lambda s, r: s.finish(r, FAIL, "x"), False, OK, FAIL, CANC),
    *cases("finish_succeeded", lambda s, r: s.finish(r, OK, "x"), ConflictError, P),
    *cases("set_handle_running", lambda s, r: s.set_handle(r, "h", R), ConflictError, P, OK),
    *cases("set_handle_starting", lambda s, r: s.set_handle(r, "h", S), ConflictError, R, FAIL),
]


@pytest.mark.parametrize(
    ("phase", "action", "expected"), [c[1:] for c in NO_OPS], ids=[c[0] for c in NO_OPS]
)
def test_refused_requests_change_nothing(
    store: Store, phase: Phase | str, action: Callable[[Store, str], Any], expected: Any
) -> None:
    run_id = new_run(store, phase)
    before = snapshot(store, run_id)
    if expected is ConflictError:
        with pytest.raises(ConflictError):
            action(store, run_id)
    else:
        assert action(store, run_id) == expected
    assert snapshot(store, run_id) == before


# -- transition table and invariants --------------------------------------------------------
@pytest.mark.parametrize("src", list(Phase), ids=str)
def test_move_follows_the_transition_table(store: Store, src: Phase) -> None:
    for dst in Phase:
        run_id = new_run(store, src, name=f"{src}-{dst}")
        before = snapshot(store, run_id)
        try:
            with store._tx() as conn:
                store._move(conn, store._locked(conn, run_id), dst, T0 + 900, "test", "t")
        except ConflictError:
            assert not can_transition(src, dst)
            assert snapshot(store, run_id) == before
        else:
            assert can_transition(src, dst)
            assert get(store, run_id).phase is dst
            assert store.events(run_id)[-1].phase_from == src.value


def test_runs_have_one_phase_and_a_valid_event_chain(store: Store) -> None:
    ids = [submit(store, f"r{i}", now=T0 + i) for i in range(8)]
    for phase, run_id in zip(Phase, ids[:7], strict=True):
        drive(store, run_id, phase)
    store.request_cancel(ids[3])
    store.requeue(ids[3], "preempted", "x", 3)  # cancel requested -> cancelled
    store.requeue(ids[2], "lost", "x", 3)
    drive(store, ids[2], Phase.SUCCEEDED, now=T0 + 1000)
    assert store.admit(ids[7], PL) and store.mark_running(ids[7])
    store.requeue(ids[7], "preempted", "x", 1)  # retries spent -> failed
    assert store.finish(ids[0], Phase.CANCELLED, "gone") and not store.mark_running(ids[0])

    by_phase = {p: {r.id for r in store.list_runs(phases=[p])} for p in Phase}
    assert sorted(i for s in by_phase.values() for i in s) == sorted(ids)
    for run in store.list_runs():
        assert run.id in by_phase[run.phase]
        chain = [e for e in store.events(run.id) if e.phase_to is not None]
        assert attrs(chain[0], "kind phase_from phase_to") == ("submitted", None, "pending")
        for prev, nxt in itertools.pairwise(chain):
            assert nxt.phase_from == prev.phase_to
            assert can_transition(Phase(prev.phase_to), Phase(nxt.phase_to))
        assert chain[-1].phase_to == run.phase.value
        assert chain[-1].attempt == run.attempt
    assert len(store.usage()) == 6  # one row per attempt that held GPUs and ended


# -- migrations --------------------------------------------------------------------------------
def test_opening_twice_keeps_one_schema_version_row(store: Store, store_url: str) -> None:
    run_id = submit(store)
    again = Store(store_url)
    try:
        assert again.get(run_id) == store.get(run_id)
        with again.engine.connect() as conn:
            assert conn.execute(select(schema_version.c.version)).all() == [(LATEST,)]
    finally:
        again.close()


def test_a_version_3_store_is_migrated_in_place(tmp_path: Path) -> None:
    """A store written before v4 (no queue time, utilization or idle time) opens, keeps its
    rows, and reads its old ledger rows with those facts unknown."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Store(url)
    run_id = submit(old)
    drive(old, run_id, Phase.RUNNING)
    assert old.finish(run_id, Phase.SUCCEEDED, "done", now=T0 + 100)
    with old.engine.begin() as conn:
        for table, col in (("runs", "queued_at"), ("usage", "queued_at"),
                           ("usage", "mean_util"), ("usage", "idle_s")):  # fmt: skip
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {col}"))
        conn.execute(schema_version.update().values(version=3))
    old.close()
    new = Store(url)
    try:
        (row,) = new.usage()
        assert (row.run_id, row.queued_at, row.mean_util, row.idle_s) == (run_id, None, None, 0.0)
        assert get(new, run_id).phase is Phase.SUCCEEDED and get(new, run_id).queued_at is None
        with new.engine.connect() as conn:
            assert conn.execute(select(schema_version.c.version)).all() == [(LATEST,)]
    finally:
        new.close()


def test_a_newer_schema_is_refused(store: Store, store_url: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(schema_version.update().values(version=LATEST + 1))
    with pytest.raises(RuntimeError, match="newer"):
        Store(store_url)


# -- leader lock -------------------------------------------------------------------------------
@pytest.mark.parametrize("other", ["same_store", "other_store"])
def test_leader_lock_is_exclusive_until_released(
    store: Store, store_url: str, other: str, request: pytest.FixtureRequest
) -> None:
    second = store if other == "same_store" else Store(store_url)
    a, b = LeaderLock(store), LeaderLock(second)
    try:
        assert a.acquire() is True
        assert b.acquire() is False
        assert b.acquire() is False
        a.release()
        assert b.acquire() is True
        assert a.acquire() is False
        b.release()
    finally:
        a.release()
        b.release()
        if second is not store:
            second.close()


HOLDER = """
import sys
from mlops_gpu.state import LeaderLock, Store
lock = LeaderLock(Store(sys.argv[1]))
print("acquired" if lock.acquire() else "busy", flush=True)
for line in sys.stdin:
    if line.strip() == "release":
        lock.release()
        print("released", flush=True)
"""


@pytest.mark.parametrize("how", ["release", "kill"])
def test_leader_lock_across_processes(
    store: Store, store_url: str, how: str, request: pytest.FixtureRequest
) -> None:
    pipe = subprocess.PIPE
    cmd = [sys.executable, "-c", HOLDER, store_url]
    proc = subprocess.Popen(cmd, stdin=pipe, stdout=pipe, text=True)
    mine = LeaderLock(store)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "acquired"
        assert mine.acquire() is False
        if how == "kill":
            proc.kill()
            proc.wait(timeout=30)
            deadline = time.monotonic() + 15  # PostgreSQL notices the dead session soon
            while not (got := mine.acquire()) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert got
            return
        proc.stdin.write("release\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        assert mine.acquire() is True
    finally:
        mine.release()
        proc.kill()
        proc.wait(timeout=30)
