"""Job control in the store (SQLite and PostgreSQL): an array in one transaction with its ids
and array column, holds with their events, dependencies resolved (array ids, names), unknown
ids refused with nothing written, doomed runs cancelled with the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlops_gpu.model import Dependency, Phase
from mlops_gpu.state import Store
from mlops_gpu.state.errors import DependencyError, WriteRefused
from mlops_gpu.state.jobs import (
    JobControl,
    cancel_doomed,
    expand_ids,
    final_phases,
    set_held,
)
from mlops_gpu.testing import make_spec

T0 = 1_000_000.0


def test_array_hold_dependencies_and_doom(store: Store) -> None:
    elements = [replace(make_spec(name="sweep"), array_index=i, array_limit=2) for i in (0, 2, 4)]
    arr = store.submit_many(elements, now=T0, job=JobControl(held=True, array=True))
    aid = arr[0].spec.array_id
    assert aid is not None and [r.id for r in arr] == [f"{aid}_{i}" for i in (0, 2, 4)]
    assert all(r.held and r.reason_code == "held" for r in arr)
    assert expand_ids(store, [aid, arr[1].id]) == [r.id for r in arr] + [arr[1].id]
    with pytest.raises(KeyError):
        expand_ids(store, ["rnothere000"])
    assert set_held(store, [arr[0].id], False, now=T0 + 1) == {arr[0].id: "released"}
    assert set_held(store, [arr[0].id], False) == {arr[0].id: "already released"}
    assert [e.kind for e in store.events(arr[0].id)] == ["submitted", "released"]
    dep = make_spec(name="after", dependencies=(Dependency("afterok", aid),))
    run = store.submit_many([dep], now=T0, job=JobControl(after_names=("sweep",)))[0]
    assert [(d.kind, d.run_id) for d in run.spec.dependencies] == [
        *(("afterok", r.id) for r in arr),
        *(("afterany", r.id) for r in arr),  # --after-name sweep: the same runs, any end
    ]
    count = store.count()
    with pytest.raises(DependencyError, match="unknown run id 'rnothere000'"):
        store.submit(make_spec(dependencies=(Dependency("afterany", "rnothere000"),)))
    assert store.count() == count
    assert final_phases(store, [arr[0].id, "rnothere000"]) == {"rnothere000": None}
    store.request_cancel(arr[0].id)
    assert final_phases(store, [arr[0].id]) == {arr[0].id: Phase.CANCELLED}
    why = f"dependency can never be met: run {arr[0].id} cancelled"
    assert cancel_doomed(store, [(run.id, why)], now=T0 + 2) == [run.id]
    assert cancel_doomed(store, [(run.id, why)]) == []  # (no longer pending)
    done = store.get(run.id)
    assert done is not None and done.phase is Phase.CANCELLED
    assert (done.reason_code, done.reason) == ("dependency", why)
    assert set_held(store, [run.id], True)[run.id].startswith("not held: it is cancelled")


def test_only_a_run_id_collision_draws_new_ids(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlops_gpu.state.base as base
    from mlops_gpu.state import audit

    taken = store.submit(make_spec(name="first"), now=T0).id
    drawn = iter([taken, "fresh0001"])
    monkeypatch.setattr(base, "new_run_id", lambda: next(drawn))
    row = audit.entry_row(user="u", action="POST /api/v1/runs", target=None,
                          client="127.0.0.1", status=201, detail="")  # fmt: skip
    # the first id drawn is taken: the runs' unique id refuses it, and the next is drawn
    assert [r.id for r in store.submit_many([make_spec()], now=T0, audit=[row])] == ["fresh0001"]
    # an audit row the store refuses (a NOT NULL column) is no collision: not retried, and
    # said as what it is; nothing of the submit is stored
    drawn = iter(["fresh0002", "fresh0003"])
    with pytest.raises(WriteRefused, match="at its audit rows"):
        store.submit_many([make_spec()], now=T0, audit=[{**row, "action": None}])
    assert next(drawn) == "fresh0003"  # one id drawn, once
    assert store.get("fresh0002") is None
