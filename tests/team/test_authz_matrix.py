"""The authorization matrix, generated from the server's own OpenAPI routes: every route x every
role (admin, maintainer, member, viewer, no role, no identity) x own/other project x own/other
run, each with the status the rules of ``server.auth`` give. A route the table does not know
fails the test (a new route must say who may call it); any 5xx fails it."""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from team.conftest import Server, no_5xx

ROLES = {"root": "admin", "mara": "maintainer", "mem": "member", "vic": "viewer",
         "nobody": None}  # fmt: skip
#: mine: a run the caller submitted in p (or, for those who cannot submit, a peer's);
#: peer: another member's run in p; foreign: a run in q (no caller but admin sees q).
TARGETS = ("mine", "peer", "foreign")


def sees(role: str | None, target: str) -> bool:
    return role == "admin" or (role is not None and target != "foreign")


def expected(method: str, path: str, role: str | None, target: str, own: bool) -> int:
    """The status the rules give ``role`` on ``method path`` aimed at ``target``; ``own``:
    whether the caller submitted the target run."""
    if role == "anonymous":
        return 200 if path in ("/livez", "/readyz") else 401
    writer = role in ("admin", "maintainer", "member")

    def as_cancel() -> int:  # cancel, hold and release: the owner member or a maintainer
        if not sees(role, target):
            return 404
        return 200 if role in ("admin", "maintainer") or (role == "member" and own) else 403

    table: dict[tuple[str, str], Callable[[], int]] = {
        ("GET", "/livez"): lambda: 200,
        ("GET", "/readyz"): lambda: 200,
        ("GET", "/metrics"): lambda: 200 if role == "admin" else 403,
        ("GET", "/api/v1/runs"): lambda: 200,
        ("GET", "/api/v1/queue"): lambda: 200,
        ("GET", "/api/v1/nodes"): lambda: 200,
        ("GET", "/api/v1/projects"): lambda: 200,
        ("GET", "/api/v1/scheduler"): lambda: 200,
        ("GET", "/api/v1/report"): lambda: 200,
        ("GET", "/api/v1/top"): lambda: 200,  # (runs of other projects left out: test_prometheus)
        ("GET", "/api/v1/whoami"): lambda: 200,
        ("GET", "/api/v1/config"): lambda: 200 if role == "admin" else 403,
        ("GET", "/api/v1/runs/{run_id}"): lambda: 200 if sees(role, target) else 404,
        ("GET", "/api/v1/runs/{run_id}/logs"): lambda: 200 if sees(role, target) else 404,
        ("POST", "/api/v1/runs/{run_id}/cancel"): as_cancel,
        ("POST", "/api/v1/runs/{run_id}/hold"): as_cancel,
        ("POST", "/api/v1/runs/{run_id}/release"): as_cancel,
        # (as cancel; every caller sends the same priority: a change only the first time,
        # then "unchanged", which is no error in any phase)
        ("PATCH", "/api/v1/runs/{run_id}"): as_cancel,
        ("GET", "/api/v1/history"): lambda: 200,
        ("GET", "/api/v1/projects/{project}"): lambda: 200 if sees(role, target) else 404,
        ("POST", "/api/v1/runs"): lambda: (
            201 if writer and sees(role, target) else 403 if sees(role, target) else 404
        ),
        ("POST", "/api/v1/runs/batch"): lambda: (
            201 if writer and sees(role, target) else 403 if sees(role, target) else 404
        ),
        ("POST", "/api/v1/runs/call"): lambda: (
            201 if writer and sees(role, target) else 403 if sees(role, target) else 404
        ),
        # (every target is a command run: a callable's value only)
        ("GET", "/api/v1/runs/{run_id}/result"): lambda: 409 if sees(role, target) else 404,
        ("GET", "/api/v1/settings"): lambda: 200,
        ("PUT", "/api/v1/projects/{project}/members/{user}"): lambda: (
            200 if role == "admin" else 403
        ),
        ("DELETE", "/api/v1/projects/{project}/members/{user}"): lambda: (
            200 if role == "admin" else 403
        ),
    }
    return table[(method, path)]()


def routes(srv: Server) -> list[tuple[str, str]]:
    with srv.client("root") as c:
        spec = c.get("/api/v1/openapi.json").json()
    return sorted((m.upper(), p) for p, ops in spec["paths"].items() for m in ops)


def request_for(
    method: str, path: str, target: str, run_ids: dict[str, str]
) -> tuple[str, dict[str, Any]]:
    project = "q" if target == "foreign" else "p"
    url = path.replace("{run_id}", run_ids[target]).replace("{project}", project)
    url = url.replace("{user}", "spare")
    body: dict[str, Any] = {}
    if path == "/api/v1/runs":
        body = {"json": {"command": ["true"], "project": project}}
    elif path == "/api/v1/runs/call":
        payload = base64.b64encode(pickle.dumps((print, (), {}))).decode()
        body = {"json": {"project": project, "payload": payload}}
    elif path == "/api/v1/runs/batch":
        body = {"json": {"runs": [{"command": ["true"], "project": project}]}}
    elif path == "/api/v1/runs/{run_id}" and method == "PATCH":
        body = {"json": {"priority": "high"}}
    elif path.endswith("/members/{user}") and method == "PUT":
        body = {"json": {"role": "viewer"}}
    return url, body


@pytest.fixture
def team(make_server: Callable[..., Server], store_url: str) -> Iterator[Server]:
    srv = make_server(store_url, "--no-scheduler")
    yield srv


def test_authorization_matrix(team: Server) -> None:
    srv = team
    all_routes = routes(srv)
    assert len(all_routes) >= 14, all_routes
    runs: dict[str, str] = {}
    for who, project in (("mem", "p"), ("peer", "p"), ("qm", "q"), ("root", "p"),
                         ("mara", "p")):  # fmt: skip
        with srv.client(who) as c:
            r = c.post("/api/v1/runs", json={"command": ["true"], "project": project})
            assert r.status_code == 201, r.text
            runs[who] = r.json()["id"]
    wrong: list[str] = []
    checked = 0
    for who, role in [*ROLES.items(), (None, "anonymous")]:
        mine = runs.get(who or "", runs["peer"])
        run_ids = {"mine": mine, "peer": runs["peer"], "foreign": runs["qm"]}
        with srv.client(who) as c:
            for method, path in all_routes:
                for target in TARGETS:
                    own = target == "mine" and who in runs
                    want = expected(method, path, role, target, own)
                    url, body = request_for(method, path, target, run_ids)
                    got = c.request(method, url, **body)
                    checked += 1
                    assert got.status_code < 500, (who, method, url, got.text)
                    if got.status_code != want:
                        wrong.append(f"{role} {method} {url} ({target}): {got.status_code} "
                                     f"!= {want}: {got.text[:200]}")  # fmt: skip
                    if got.status_code >= 400:
                        err = got.json()["error"]
                        assert set(err) == {"code", "message", "field"}, got.text
    assert not wrong, "\n".join(wrong)
    assert checked == len(all_routes) * len(TARGETS) * (len(ROLES) + 1)
    no_5xx(srv)


def test_runs_of_projects_without_a_role_are_invisible(team: Server) -> None:
    srv = team
    ids = {}
    for who, project in (("mem", "p"), ("qm", "q")):
        with srv.client(who) as c:
            ids[who] = c.post("/api/v1/runs", json={"command": ["true"], "project": project}
                              ).json()["id"]  # fmt: skip
    with srv.client("vic") as c:
        listed = [r["id"] for r in c.get("/api/v1/runs").json()["runs"]]
        assert listed == [ids["mem"]]
        assert [r["id"] for r in c.get("/api/v1/queue").json()] == [ids["mem"]]
        assert c.get("/api/v1/runs", params={"project": "q"}).json()["runs"] == []
        gone = c.get(f"/api/v1/runs/{ids['qm']}")
        missing = c.get("/api/v1/runs/r0000000000")
        assert gone.status_code == missing.status_code == 404
        # the same answer as for a run that does not exist, but for the id
        assert gone.json()["error"]["message"].replace(ids["qm"], "X") == \
            missing.json()["error"]["message"].replace("r0000000000", "X")  # fmt: skip
    with srv.client("nobody") as c:
        assert c.get("/api/v1/runs").json()["runs"] == []
        assert c.get("/api/v1/projects").json() == []


def test_admin_sets_a_role_through_the_api_and_it_applies_at_once(team: Server) -> None:
    srv = team
    with srv.client("spare") as spare, srv.client("root") as admin:
        assert spare.post("/api/v1/runs", json={"command": ["true"], "project": "q"}
                          ).status_code == 404  # fmt: skip
        r = admin.put("/api/v1/projects/q/members/spare", json={"role": "member"})
        assert r.status_code == 200, r.text
        assert spare.post("/api/v1/runs", json={"command": ["true"], "project": "q"}
                          ).status_code == 201  # fmt: skip
        assert admin.delete("/api/v1/projects/q/members/spare").status_code == 200
        assert spare.get("/api/v1/projects/q").status_code == 404
        assert admin.put("/api/v1/projects/nope/members/spare",
                         json={"role": "member"}).status_code == 404  # fmt: skip
        assert admin.put("/api/v1/projects/q/members/ghost",
                         json={"role": "member"}).status_code == 404  # fmt: skip
