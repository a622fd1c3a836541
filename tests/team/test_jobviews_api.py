"""``PATCH /api/v1/runs/{id}`` (update), ``GET /api/v1/history`` and ``GET /queue?user=`` against
a real server, by role; and the remote CLI's ``update``, ``history`` and ``--mine`` (the
token's user). Runs are moved through the store as a scheduler would (``--no-scheduler``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from mlops_gpu.model import NodeSlot, Phase, Placement
from mlops_gpu.state import audit
from team.conftest import Server, no_5xx


def submit(srv: Server, who: str, project: str = "p", **body: Any) -> str:
    with srv.client(who) as c:
        r = c.post("/api/v1/runs", json={"command": ["true"], "project": project, **body})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def run_it(srv: Server, run_id: str, end: Phase | None = None, held_s: float = 30.0) -> None:
    """admitted -> running (-> ``end``, ``held_s`` after admission), as the scheduler does."""
    store = srv.store()
    t0 = time.time() - 60
    try:
        place = Placement("local", "a100-80gb", (NodeSlot("node-a", ("0",)),))
        assert store.admit(run_id, place, now=t0)
        store.set_handle(run_id, "local:x", Phase.RUNNING, now=t0)
        if end is not None:
            code = 0 if end is Phase.SUCCEEDED else 1
            store.finish(run_id, end, f"exited {code}", exit_code=code, now=t0 + held_s)
    finally:
        store.close()


@pytest.fixture
def team(make_server: Callable[..., Server], store_url: str) -> Server:
    return make_server(store_url, "--no-scheduler")


def test_patch_by_role_validation_and_phase(team: Server) -> None:
    srv = team
    mine, peers = submit(srv, "mem"), submit(srv, "peer")
    theirs = submit(srv, "qm", "q")
    with srv.client("mem") as c:
        r = c.patch(f"/api/v1/runs/{mine}", json={"priority": "high", "gpus": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["result"] == "updated by user: priority normal -> high; gpus 1 -> 2"
        assert (body["phase"], body["run"]["priority"], body["run"]["gpus"]) == (
            "pending", "high", 2)  # fmt: skip
        events = c.get(f"/api/v1/runs/{mine}", params={"events": "true"}).json()["events"]
        assert events[-1]["kind"] == "updated" and events[-1]["reason"] == body["result"]
        # a member changes only its own runs; a project without a role does not exist
        assert c.patch(f"/api/v1/runs/{peers}", json={"priority": "high"}).status_code == 403
        assert c.patch(f"/api/v1/runs/{theirs}", json={"priority": "high"}).status_code == 404
        # validated as at submit: one line, 422; unknown keys and wrong types refused
        r = c.patch(f"/api/v1/runs/{mine}", json={"gpus": 99})
        assert r.status_code == 422 and "gpus: 99 GPUs per node" in r.json()["error"]["message"]
        r = c.patch(f"/api/v1/runs/{mine}", json={"priority": "top"})
        assert r.status_code == 422 and "unknown priority class 'top'" in r.text
        assert c.patch(f"/api/v1/runs/{mine}", json={"bogus": 1}).status_code == 422
        assert c.patch(f"/api/v1/runs/{mine}", json={"gpus": "2"}).status_code == 422
        assert c.patch(f"/api/v1/runs/{mine}", json={}).status_code == 422
    with srv.client("vic") as c:
        assert c.patch(f"/api/v1/runs/{mine}", json={"priority": "low"}).status_code == 403
    with srv.client("mara") as c:
        r = c.patch(f"/api/v1/runs/{peers}", json={"max_runtime_s": 600})
        assert r.status_code == 200, r.text
    # running: priority and a shorter max runtime only (409 otherwise)
    run_it(srv, mine)
    with srv.client("mem") as c:
        r = c.patch(f"/api/v1/runs/{mine}", json={"gpus": 1})
        assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
        assert "only --priority and a shorter --max-runtime" in r.json()["error"]["message"]
        assert c.patch(f"/api/v1/runs/{mine}", json={"max_runtime_s": 60}).status_code == 200
        r = c.patch(f"/api/v1/runs/{mine}", json={"max_runtime_s": 120})
        assert r.status_code == 409 and "can only be shortened" in r.text
        assert c.patch(f"/api/v1/runs/{mine}", json={"priority": "low"}).status_code == 200
    store = srv.store()
    try:
        rows = [a for a in audit.read(store) if a.action.startswith("PATCH")]
    finally:
        store.close()
    want = {("mem", mine, 200), ("mem", peers, 403), ("vic", mine, 403), ("mem", mine, 409)}
    assert {(a.user, a.target, a.status) for a in rows} >= want
    assert any(a.detail and "priority normal -> high" in a.detail for a in rows)
    no_5xx(srv)


def test_history_and_queue_by_user_show_only_visible_projects(team: Server) -> None:
    srv = team
    ok, bad = submit(srv, "mem"), submit(srv, "peer")
    other = submit(srv, "qm", "q")
    waiting = submit(srv, "mem")
    run_it(srv, ok, Phase.SUCCEEDED)
    run_it(srv, bad, Phase.FAILED)
    run_it(srv, other, Phase.SUCCEEDED)
    with srv.client("vic") as c:
        rows = c.get("/api/v1/history").json()
        assert {r["id"] for r in rows} == {ok, bad}  # not q's run
        by = {r["id"]: r for r in rows}
        assert (by[bad]["phase"], by[bad]["exit_code"], by[bad]["user"]) == ("failed", 1, "peer")
        assert by[ok]["gpu_hours"] > 0 and by[ok]["cost_usd"] > 0 and by[ok]["attempts"] == 1
        assert [r["id"] for r in c.get("/api/v1/history", params={"user": "mem"}).json()] == [ok]
        assert c.get("/api/v1/history", params={"project": "q"}).json() == []
        later = c.get("/api/v1/history", params={"since": "2999-01-01T00:00:00"}).json()
        assert later == []
        assert c.get("/api/v1/history", params={"limit": 0}).status_code == 422
        assert [r["id"] for r in c.get("/api/v1/queue", params={"user": "mem"}).json()] == [waiting]
        assert c.get("/api/v1/queue", params={"user": "peer"}).json() == []
    with srv.client("root") as c:
        assert {r["id"] for r in c.get("/api/v1/history").json()} == {ok, bad, other}
    with srv.client("nobody") as c:
        assert c.get("/api/v1/history").json() == []
    no_5xx(srv)


def test_remote_cli_update_history_and_mine(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    srv = make_server(None, "--no-scheduler")
    home = tmp_path / "laptop"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": "", "MLOPS_GPU_CONFIG": "",
           "MLOPS_GPU_USER": "root", "MLOPS_GPU_URL": "", "MLOPS_GPU_TOKEN": ""}  # fmt: skip

    def cli(*args: str) -> tuple[int, str, str]:
        r = run_cli(*args, cwd=home, env=env)
        return r.returncode, r.stdout, r.stderr

    assert cli("login", srv.url, "--token", srv.tokens["mem"])[0] == 0
    mine, peers = submit(srv, "mem"), submit(srv, "peer")
    rc, out, err = cli("update", mine, "--priority", "high")
    assert (rc, out) == (0, f"{mine}: updated by user: priority normal -> high\n"), err
    rc, out, err = cli("update", peers, "--priority", "high")
    assert rc == 2 and "you cannot update run" in err and len(err.splitlines()) == 1
    rc, out, err = cli("update", mine, "--gpus", "99")
    assert rc == 2 and "gpus: 99 GPUs per node" in err
    # --mine is the token's user (mem), not MLOPS_GPU_USER (root)
    rc, out, err = cli("queue", "--mine", "--json")
    assert rc == 0 and [r["id"] for r in json.loads(out)] == [mine], err
    rc, out, err = cli("status", "--mine", "--json")
    assert [r["id"] for r in json.loads(out)] == [mine]
    rc, out, err = cli("status", "--user", "peer", "--json")
    assert [r["id"] for r in json.loads(out)] == [peers]
    run_it(srv, mine, Phase.SUCCEEDED)
    run_it(srv, peers, Phase.SUCCEEDED)
    rc, out, err = cli("history", "--mine", "--json")
    assert rc == 0 and [r["id"] for r in json.loads(out)] == [mine], err
    local = run_cli("--config", str(srv.cfg), "history", "--user", "mem", "--json")
    assert json.loads(local.stdout) == json.loads(out)  # the same rows as local mode
    rc, out, err = cli("history", "--csv")
    assert rc == 0 and out.splitlines()[0].startswith("id,name,project,user,phase")
    assert len(out.splitlines()) == 3
    no_5xx(srv)
