"""``update ARRAY_ID``: every pending element changes in one transaction (``amend_many``: all
or none, on SQLite and PostgreSQL), each change an ``updated`` event, validated as for one run;
end to end on the local backend as a user types it. An element of a limited array alone may
change only its max runtime; the whole array may change anything."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_cli

from mlops_gpu.state import ConflictError, Store
from mlops_gpu.state.amend import amend_many
from mlops_gpu.state.jobs import JobControl
from mlops_gpu.testing import config_yaml, make_spec


def test_amend_many_is_all_or_none(store: Store) -> None:
    arr = store.submit_many([replace(make_spec(), array_index=i) for i in range(3)],
                            job=JobControl(array=True))  # fmt: skip
    hi = [(r.id, r.spec, replace(r.spec, priority="high")) for r in arr]
    stale = (arr[2].id, replace(arr[2].spec, max_runtime_s=5.0), arr[2].spec)
    with pytest.raises(ConflictError, match="was updated meanwhile"):
        amend_many(store, [*hi[:2], stale])
    assert [store.get(r.id).spec.priority for r in arr] == ["normal"] * 3  # type: ignore[union-attr]
    assert all(e.kind != "updated" for r in arr for e in store.events(r.id))
    store.request_cancel(arr[1].id)
    with pytest.raises(ConflictError, match="became cancelled meanwhile"):
        amend_many(store, hi, pending_only=True)
    amend_many(store, [hi[0], hi[2]], pending_only=True)
    assert [store.get(r.id).spec.priority for r in arr] == ["high", "normal", "high"]  # type: ignore[union-attr]
    assert [e.reason for e in store.events(arr[0].id) if e.kind == "updated"] == [
        "updated by user: priority normal -> high"
    ]


def cli(cfg: Path, *args: str) -> tuple[int, str, str]:
    r = run_cli("--config", str(cfg), *args)
    return r.returncode, r.stdout, r.stderr


def test_update_an_array_id_on_the_local_backend(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(nodes=[("node-a", 2)], projects={"p": (2, 0)}))
    rc, out, err = cli(cfg, "submit", "--no-start", "-p", "p", "--hold", "--array", "0-3%2",
                       "--", "true")  # fmt: skip
    assert rc == 0, err
    aid = out.strip()
    ids = [f"{aid}_{i}" for i in range(4)]
    assert cli(cfg, "cancel", ids[3])[0] == 0
    rc, out, err = cli(cfg, "update", aid, "--priority", "high")
    assert rc == 0, err
    assert out.splitlines() == [
        *(f"{e}: updated by user: priority normal -> high" for e in ids[:3]),
        f"{ids[3]}: not updated: it is cancelled (only pending elements of an array change)",
    ]
    runs = {r["id"]: r for r in json.loads(cli(cfg, "status", aid, "--json", "--events")[1])}
    assert [runs[e]["priority"] for e in ids] == ["high", "high", "high", "normal"]
    assert [ev["kind"] for ev in runs[ids[0]]["events"]][-1] == "updated"
    # again: nothing to change is no error
    rc, out, err = cli(cfg, "update", aid, "--priority", "high", "--json")
    assert rc == 0 and [r["id"] for r in json.loads(out)] == ids, err
    # validated as at submit: one line, nothing written
    for args, msg in ((["--gpus", "9"], "gpus: 9 GPUs per node"),
                      (["--priority", "top"], "unknown priority class 'top'"),
                      ([], "nothing to update")):  # fmt: skip
        rc, out, err = cli(cfg, "update", aid, *args)
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1 and out == "", err
    # one element of the limited array: only its max runtime
    rc, out, err = cli(cfg, "update", ids[0], "--gpus", "2")
    assert rc == 2 and f"element of array {aid} with a limit (%2)" in err, err
    rc, out, err = cli(cfg, "update", ids[0], "--max-runtime", "1h")
    assert rc == 0 and out == f"{ids[0]}: updated by user: max_runtime none -> 3600s\n", err
    # the whole array: anything, validated
    rc, out, err = cli(cfg, "update", aid, "--gpus", "2")
    assert rc == 0 and out.count("gpus 1 -> 2") == 3, err
    assert [r["gpus"] for r in json.loads(cli(cfg, "status", aid, "--json")[1])] == [2, 2, 2, 1]
    rc, out, err = cli(cfg, "update", "r0000000000", "--gpus", "1")
    assert rc == 2 and "no run with id 'r0000000000'" in err
    assert cli(cfg, "cancel", aid)[0] == 0
    rc, out, err = cli(cfg, "update", aid, "--priority", "low")
    assert rc == 2 and f"array {aid} has no pending element" in err, err
