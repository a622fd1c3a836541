"""Attempts' MLflow runs in the store's own table (``state.mlflow_notes``), on SQLite and a real
PostgreSQL: what each note does to an attempt's rows, what a start finds unclosed, and a store
written by the previous version (MLflow run ids in the text of ``mlflow_run``/``mlflow_closed``
events, placeholders ``pending:RUN:ATTEMPT``, schema v11) opened by this one: its links kept."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from mlops_gpu.model import ACTIVE_PHASES
from mlops_gpu.state.dashboard_reads import run_notes
from mlops_gpu.state.migrations import LATEST
from mlops_gpu.state.mlflow_notes import MlflowNote
from mlops_gpu.state.schema import events, mlflow_runs, runs, schema_version, usage
from mlops_gpu.state.store import Store
from mlops_gpu.testing import make_spec

T0 = 1_800_000_000.0


def rows(store: Store, run_id: str) -> list[tuple[int, str | None, bool]]:
    """(attempt, MLflow run id, closed) of each of the run's MLflow runs, in the order noted."""
    return [(m.attempt, m.mlflow_run_id, m.closed_at is not None)
            for m in store.mlflow_links(run_id)]  # fmt: skip


def opened(m: str | None, attempt: int = 1) -> MlflowNote:
    return MlflowNote("r1", attempt, "opened", m)


def made(m: str, attempt: int = 1) -> MlflowNote:
    return MlflowNote("r1", attempt, "made", m)


def closed(m: str | None, attempt: int = 1) -> MlflowNote:
    return MlflowNote("r1", attempt, "closed", m)


@pytest.mark.parametrize(
    ("notes", "want"),
    [
        pytest.param([opened("a")], [(1, "a", False)], id="launch"),
        pytest.param([opened("a"), closed("a")], [(1, "a", True)], id="launch-close"),
        pytest.param([opened("a"), opened("b")], [(1, "a", False), (1, "b", False)],
                     id="failed-launch-then-retry"),
        pytest.param([opened("m"), opened("b"), opened("m")], [(1, "b", False), (1, "m", False)],
                     id="adopted-again-moves-last"),
        pytest.param([opened("m"), closed("m"), opened("m")], [(1, "m", True)],
                     id="noted-again-stays-closed"),
        pytest.param([opened(None), made("a")], [(1, "a", False)], id="made-after-launch"),
        pytest.param([made("a"), opened(None)], [(1, "a", False), (1, None, False)],
                     id="made-with-no-row-gets-its-own"),
        pytest.param([opened(None), opened(None)], [(1, None, False)],
                     id="one-open-row-without-id"),
        pytest.param([opened(None), closed(None), opened(None)],
                     [(1, None, True), (1, None, False)], id="closed-without-id-then-new"),
        pytest.param([opened(None), opened(None), made("a"), made("b")],
                     [(1, "a", False), (1, "b", False)], id="second-made-gets-own-row"),
        pytest.param([closed("x")], [], id="close-of-nothing-noted"),
        pytest.param([opened("a"), opened("b", 2), closed("a")], [(1, "a", True), (2, "b", False)],
                     id="attempts-apart"),
    ],
)  # fmt: skip
def test_notes_change_an_attempts_rows(
    store: Store, notes: list[MlflowNote], want: list[tuple[int, str | None, bool]]
) -> None:
    run = store.submit(make_spec(), now=T0)
    notes = [MlflowNote(run.id, n.attempt, n.op, n.mlflow_run_id) for n in notes]
    for i, n in enumerate(notes):  # one transaction each, then all in one: the same rows
        store.note_mlflow([n], now=T0 + i)
    assert rows(store, run.id) == want
    other = store.submit(make_spec(), now=T0)
    store.note_mlflow([MlflowNote(other.id, n.attempt, n.op, n.mlflow_run_id) for n in notes])
    assert rows(store, other.id) == want
    said = [e.reason for e in store.events(run.id) if e.kind.startswith("mlflow")]
    assert len(said) == len([n for n in notes if n.op != "closed" or want]), said


def set_phase(store: Store, run_id: str, phase: str, attempt: int = 1) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == run_id).values(phase=phase, attempt=attempt))


def ledger(store: Store, run_id: str, outcome: str, attempt: int = 1) -> None:
    with store.engine.begin() as conn:
        conn.execute(usage.insert().values(
            run_id=run_id, attempt=attempt, project="p", user="u", gpu_type="a100-80gb",
            backend="local", gpus=1.0, start=T0 + 10, end=T0 + 3610, gpu_seconds=3600.0,
            outcome=outcome, queued_at=T0, mean_util=50.0, idle_s=0.0,
        ))  # fmt: skip


def test_a_start_finds_attempts_over_and_unclosed(store: Store) -> None:
    ended, live, retried, never, moved = (store.submit(make_spec(), now=T0) for _ in range(5))
    set_phase(store, ended.id, "succeeded")
    ledger(store, ended.id, "succeeded")
    set_phase(store, live.id, "running")
    set_phase(store, retried.id, "running")
    set_phase(store, never.id, "failed")
    set_phase(store, moved.id, "running", attempt=2)
    ledger(store, moved.id, "preempted")
    store.note_mlflow([
        MlflowNote(ended.id, 1, "opened", "m-ended"), MlflowNote(live.id, 1, "opened", "m-live"),
        MlflowNote(retried.id, 1, "opened", "m-fail"), MlflowNote(retried.id, 1, "opened", "m-ok"),
        MlflowNote(never.id, 1, "opened", None), MlflowNote(moved.id, 1, "opened", "m-1"),
        MlflowNote(moved.id, 2, "opened", "m-2"),
    ], now=T0)  # fmt: skip
    found = {(u.run_id, u.mlflow_run_id): u for u in store.unclosed_mlflow_runs(ACTIVE_PHASES)}
    assert set(found) == {(ended.id, "m-ended"), (retried.id, "m-fail"), (never.id, None),
                          (moved.id, "m-1")}  # fmt: skip
    assert found[(ended.id, "m-ended")].gpu_seconds == 3600.0
    assert found[(ended.id, "m-ended")].outcome == "succeeded"
    assert found[(retried.id, "m-fail")].outcome is None  # a failed launch: no GPUs held
    assert found[(moved.id, "m-1")].outcome == "preempted"
    assert store.mlflow_run_id(retried.id, 1) == "m-ok"
    assert store.mlflow_run_id(never.id, 1) is None  # (its run not made)


#: What the previous version wrote (``kind``, ``reason`` = the MLflow run id), run by run.
OLD_EVENTS = {
    "done": [("mlflow_run", 1, "m-done"), ("mlflow_closed", 1, "m-done")],
    "ended": [("mlflow_run", 1, "m-ended")],
    "live": [("mlflow_run", 1, "m-live")],
    "retry": [("mlflow_run", 1, "m-fail"), ("mlflow_run", 1, "m-retry")],
    "late": [("mlflow_run", 1, "pending:{id}:1"), ("mlflow_run", 1, "m-late"),
             ("mlflow_closed", 1, "pending:{id}:1")],
    "pend": [("mlflow_run", 1, "pending:{id}:1")],
    "adopt": [("mlflow_run", 1, "m-mine"), ("mlflow_run", 1, "m-mine")],
    "requeued": [("mlflow_run", 1, "m-a1"), ("mlflow_closed", 1, "m-a1"),
                 ("mlflow_run", 2, "m-a2")],
}  # fmt: skip
PHASES = {"done": ("succeeded", 1), "ended": ("succeeded", 1), "live": ("running", 1),
          "retry": ("running", 1), "late": ("running", 1), "pend": ("succeeded", 1),
          "adopt": ("running", 1), "requeued": ("running", 2)}  # fmt: skip


def test_a_store_of_the_previous_version_keeps_its_mlflow_links(store_url: str) -> None:
    old = Store(store_url)
    ids = {name: old.submit(make_spec(name=name), now=T0).id for name in OLD_EVENTS}
    for name, (phase, attempt) in PHASES.items():
        set_phase(old, ids[name], phase, attempt)
    ledger(old, ids["ended"], "succeeded")
    ledger(old, ids["pend"], "succeeded")
    with old.engine.begin() as conn:  # the store as v11 wrote it: no table, the ids in text
        mlflow_runs.drop(conn)
        conn.execute(schema_version.update().values(version=11))
        conn.execute(events.insert(), [
            {"run_id": ids[name], "time": T0 + i, "kind": kind, "attempt": attempt,
             "reason": text.format(id=ids[name])}
            for name, noted in OLD_EVENTS.items()
            for i, (kind, attempt, text) in enumerate(noted)
        ])  # fmt: skip
    old.close()
    new = Store(store_url)
    try:
        with new.engine.connect() as conn:
            assert conn.execute(select(schema_version.c.version)).all() == [(LATEST,)]
        got = {name: rows(new, rid) for name, rid in ids.items()}
        assert got == {
            "done": [(1, "m-done", True)],
            "ended": [(1, "m-ended", False)],
            "live": [(1, "m-live", False)],
            "retry": [(1, "m-fail", False), (1, "m-retry", False)],
            "late": [(1, None, True), (1, "m-late", False)],
            "pend": [(1, None, False)],
            "adopt": [(1, "m-mine", False)],
            "requeued": [(1, "m-a1", True), (2, "m-a2", False)],
        }
        current = {name: new.mlflow_run_id(rid, PHASES[name][1]) for name, rid in ids.items()}
        assert current == {"done": "m-done", "ended": "m-ended", "live": "m-live",
                           "retry": "m-retry", "late": "m-late", "pend": None,
                           "adopt": "m-mine", "requeued": "m-a2"}  # fmt: skip
        unclosed = {(u.run_id, u.mlflow_run_id) for u in new.unclosed_mlflow_runs(ACTIVE_PHASES)}
        assert unclosed == {(ids["ended"], "m-ended"), (ids["retry"], "m-fail"),
                            (ids["pend"], None)}  # fmt: skip
        notes = run_notes(new, list(ids.values()))
        assert {n: notes[rid].mlflow_run_id for n, rid in ids.items() if rid in notes} == {
            n: m for n, m in current.items() if m is not None
        }
        # the history stays as it was written, and the table goes on from there
        assert [e.reason for e in new.events(ids["live"]) if e.kind == "mlflow_run"] == ["m-live"]
        new.note_mlflow([MlflowNote(ids["live"], 1, "closed", "m-live")], now=T0 + 99)
        assert rows(new, ids["live"]) == [(1, "m-live", True)]
    finally:
        new.close()
