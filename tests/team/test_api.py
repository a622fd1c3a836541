"""The REST API end to end against a real server process: submit (one and a batch), get, list
(filters, cursor pages), cancel, logs (whole and followed), queue with reasons, nodes,
projects, config, scheduler status, health; on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import run_cli

from team.conftest import Server, no_5xx

SUBMIT = {"command": ["sh", "-c", "echo out-$0; echo err-$0 >&2", "x"], "project": "p"}


def _wait(c: Any, run_id: str, phases: set[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = c.get(f"/api/v1/runs/{run_id}")
        assert r.status_code == 200, r.text
        if r.json()["phase"] in phases:
            return dict(r.json())
        assert time.monotonic() < deadline, r.json()
        time.sleep(0.2)


def test_submit_runs_to_the_end_with_logs(
    make_server: Callable[..., Server], store_url: str
) -> None:
    srv = make_server(store_url)
    with srv.client("mem") as c:
        r = c.post("/api/v1/runs", json=SUBMIT)
        assert r.status_code == 201, r.text
        run = r.json()
        assert run["user"] == "mem" and run["project"] == "p" and run["phase"] == "pending"
        done = _wait(c, run["id"], {"succeeded", "failed"})
        assert done["phase"] == "succeeded", done
        logs = c.get(f"/api/v1/runs/{run['id']}/logs")
        assert logs.status_code == 200
        assert logs.text == "out-x\n--- stderr ---\nerr-x\n"
        with_events = c.get(f"/api/v1/runs/{run['id']}", params={"events": "true"}).json()
        assert with_events["events"][0]["kind"] == "submitted"
        assert "succeeded" in [e["kind"] for e in with_events["events"]]
        # what the server wrote is in the store for every other process (one store open per
        # server process: a second open of the SQLite file dropped its locks, and the next
        # process to close deleted the WAL the server went on writing to)
        second = c.post("/api/v1/runs", json=SUBMIT).json()
        _wait(c, second["id"], {"succeeded"})
        assert run_cli("--config", str(srv.cfg), "status", "--all").returncode == 0
        third = c.post("/api/v1/runs", json=SUBMIT).json()
        assert srv.counts()[0] == 3 and third["id"]
        status = c.get("/api/v1/scheduler").json()
        assert status["running"] is True and status["this_server"] == "leader"
        assert c.get("/readyz").json() == {"ok": True, "store": "ok", "scheduler": "leader"}
    no_5xx(srv)


def test_logs_follow_streams_until_the_run_ends(make_server: Callable[..., Server]) -> None:
    srv = make_server()
    body = {"command": ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.5; done"],
            "project": "p"}  # fmt: skip
    with srv.client("mem") as c:
        run = c.post("/api/v1/runs", json=body).json()
        _wait(c, run["id"], {"running", "succeeded"})
        got = []
        t0 = time.monotonic()
        with c.stream("GET", f"/api/v1/runs/{run['id']}/logs", params={"follow": "true"}) as r:
            assert r.status_code == 200
            for chunk in r.iter_text():
                got.append((time.monotonic() - t0, chunk))
        text = "".join(c for _, c in got)
        assert text == "line1\nline2\nline3\n"
        assert len(got) >= 2, got  # more than one piece: it streamed as the run wrote
        assert c.get(f"/api/v1/runs/{run['id']}").json()["phase"] == "succeeded"


def test_batch_list_pages_filters_and_cancel(
    make_server: Callable[..., Server], store_url: str
) -> None:
    srv = make_server(store_url, "--no-scheduler")
    with srv.client("mem") as c, srv.client("peer") as peer, srv.client("mara") as mara:
        r = c.post("/api/v1/runs/batch",
                   json={"runs": [{**SUBMIT, "name": f"b{i}"} for i in range(25)]})  # fmt: skip
        assert r.status_code == 201, r.text
        ids = [x["id"] for x in r.json()["runs"]]
        assert len(set(ids)) == 25
        mid = time.time()
        time.sleep(0.05)
        theirs = peer.post("/api/v1/runs", json={**SUBMIT, "name": "peer's"}).json()
        # cursor pages: newest first, every run exactly once
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 10, **({"cursor": cursor} if cursor else {})}
            page = c.get("/api/v1/runs", params=params).json()
            seen += [x["id"] for x in page["runs"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3
        assert seen == [theirs["id"], *reversed(ids)]
        # filters
        assert [x["id"] for x in c.get("/api/v1/runs", params={"user": "peer"}).json()["runs"]] \
            == [theirs["id"]]  # fmt: skip
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mid)) + f"{mid % 1:.3f}"[1:] + "Z"
        assert [x["id"] for x in c.get("/api/v1/runs", params={"since": since}).json()["runs"]] \
            == [theirs["id"]]  # fmt: skip
        assert c.get("/api/v1/runs", params={"project": "q"}).json()["runs"] == []
        # cancel: a member cancels its own run, not a peer's; a maintainer cancels any
        assert c.post(f"/api/v1/runs/{ids[0]}/cancel").json() == {
            "id": ids[0], "phase": "cancelled", "result": "cancelled"}  # fmt: skip
        assert c.post(f"/api/v1/runs/{theirs['id']}/cancel").status_code == 403
        assert mara.post(f"/api/v1/runs/{theirs['id']}/cancel").json()["phase"] == "cancelled"
        done = c.get("/api/v1/runs", params={"phase": "cancelled", "limit": 1000}).json()
        phases = {x["id"]: x["phase"] for x in done["runs"]}
        assert phases == {ids[0]: "cancelled", theirs["id"]: "cancelled"}
        pending = c.get("/api/v1/runs", params={"phase": "pending", "limit": 1000}).json()
        assert len(pending["runs"]) == 24
        # the queue: pending runs oldest first; no scheduler runs, so no reasons yet
        q = c.get("/api/v1/queue").json()
        assert [x["id"] for x in q] == ids[1:]
        assert c.get("/api/v1/scheduler").json()["this_server"] == "off"
    no_5xx(srv)


def test_queue_reasons_nodes_and_projects(make_server: Callable[..., Server]) -> None:
    srv = make_server()
    with srv.client("mem") as c, srv.client("qm") as qm:
        hold = qm.post("/api/v1/runs", json={"command": ["sleep", "600"], "project": "q",
                                              "gpus": 2}).json()  # fmt: skip
        _wait(qm, hold["id"], {"running"})
        big = c.post("/api/v1/runs", json={**SUBMIT, "gpus": 3}).json()  # 2 of 4 GPUs free
        deadline = time.monotonic() + 30
        while True:
            q = c.get("/api/v1/queue").json()
            if q and q[0]["reason"]:
                break
            assert time.monotonic() < deadline, q
            time.sleep(0.2)
        assert [x["id"] for x in q] == [big["id"]]
        assert q[0]["reason_code"] and "3" in q[0]["reason"], q[0]
        nodes = c.get("/api/v1/nodes").json()
        assert nodes[0]["name"] == "node-a" and nodes[0]["free_gpus"] == 2
        assert nodes[0]["runs"] == []  # q's run is not mem's to see
        assert qm.get("/api/v1/nodes").json()[0]["runs"] == [hold["id"]]
        projects = c.get("/api/v1/projects").json()
        assert [p["name"] for p in projects] == ["p"]
        assert projects[0]["role"] == "member" and projects[0]["pending"] == 1
        pq = qm.get("/api/v1/projects/q").json()
        assert pq["usage"] == {"a100-80gb": 2.0} and pq["active"] == 1
        assert pq["quotas"]["a100-80gb"]["nominal"] == 4 and pq["fair_share"] >= 0
        assert c.get("/api/v1/projects/q").status_code == 404
        assert qm.post(f"/api/v1/runs/{hold['id']}/cancel").json()["phase"] == "running"
        _wait(qm, hold["id"], {"cancelled"})
        # the report counts only what the identity sees
        rep = qm.get("/api/v1/report", params={"by": "user"}).json()
        assert [r["key"] for r in rep["rows"]] == ["qm"] and rep["total"]["runs"] == 1
        assert "q" not in [r["key"] for r in c.get("/api/v1/report").json()["rows"]]
    with srv.client("root") as admin:
        cfg = admin.get("/api/v1/config").json()
        assert cfg["projects"]["p"]["members"] == {"mara": "maintainer", "vic": "viewer"}
        assert {p["name"] for p in admin.get("/api/v1/projects").json()} == {"p", "q"}
    no_5xx(srv)


def test_openapi_lists_every_endpoint(make_server: Callable[..., Server]) -> None:
    srv = make_server(None, "--no-scheduler")
    with srv.client("vic") as c:
        spec = c.get("/api/v1/openapi.json").json()
    paths = set(spec["paths"])
    for want in ("/api/v1/runs", "/api/v1/runs/batch", "/api/v1/runs/{run_id}",
                 "/api/v1/runs/{run_id}/cancel", "/api/v1/runs/{run_id}/logs", "/api/v1/queue",
                 "/api/v1/nodes", "/api/v1/projects", "/api/v1/projects/{project}",
                 "/api/v1/config", "/api/v1/scheduler", "/livez", "/readyz"):  # fmt: skip
        assert want in paths
    with srv.client() as anon:
        assert anon.get("/api/v1/openapi.json").status_code == 401
        assert anon.get("/livez").json() == {"ok": True}


@pytest.mark.parametrize("what", ["single", "batch"])
def test_a_rejected_submit_stores_nothing(make_server: Callable[..., Server], what: str) -> None:
    srv = make_server(None, "--no-scheduler")
    bad = {**SUBMIT, "gpu_types": ["h100-nope"]}
    with srv.client("mem") as c:
        if what == "single":
            r = c.post("/api/v1/runs", json=bad)
        else:
            r = c.post("/api/v1/runs/batch", json={"runs": [SUBMIT, bad]})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "rejected" and "h100-nope" in r.json()["error"]["message"]
    assert srv.counts() == (0, 0)
