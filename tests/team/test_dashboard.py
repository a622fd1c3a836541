"""The web dashboard over HTTP against a real server (the browser's view is
``test_dashboard_browser``): the login and its cookie, what each role sees, the cancel button's
checks (role, CSRF token, origin), hostile run names rendered as text, bad query values, and
the trusted-proxy mode without a login."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import httpx
import pytest
from markupsafe import escape

from team.conftest import Server, no_5xx

HOSTILE = "<script>alert('x')</script>\"><img src=x onerror=alert(1)>"
PAGES = ("/", "/runs", "/cluster", "/projects", "/costs")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from team.conftest import USERS, add_users, start_server, stop_server, team_config

    d = tmp_path_factory.mktemp("dash")
    cfg = d / "mlops-gpu.yaml"
    cfg.write_text(team_config("sqlite:///state.db"))
    tokens = add_users(cfg, USERS)
    srv = start_server(cfg, "--no-scheduler")  # runs stay pending: the pages are deterministic
    srv.tokens = tokens
    yield srv
    stop_server(srv)


def browser(srv: Server, who: str | None) -> httpx.Client:
    """A client holding ``who``'s session cookie, as the browser does after the login."""
    cookies = {"mlops_gpu_session": srv.tokens[who]} if who else {}
    return httpx.Client(base_url=srv.url, cookies=cookies, timeout=30)


def submit(srv: Server, who: str, project: str = "p", name: str = "job") -> str:
    with srv.client(who) as c:
        r = c.post("/api/v1/runs", json={"project": project, "command": ["true"], "gpus": 1,
                                         "name": name})  # fmt: skip
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def csrf(page: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert m, "no CSRF token on the page"
    return m.group(1)


def phase(srv: Server, run_id: str) -> str:
    with srv.client("root") as c:
        return str(c.get(f"/api/v1/runs/{run_id}").json()["phase"])


def test_login_sets_an_httponly_strict_cookie_and_pages_need_it(server: Server) -> None:
    with browser(server, None) as c:
        for path in PAGES:
            r = c.get(path)
            assert r.status_code == 303 and r.headers["location"] == "/login", path
        assert 'name="token"' in c.get("/login").text
        bad = c.post("/login", data={"token": "mgt_not-a-token"})
        assert bad.status_code == 401 and "invalid, expired or revoked token" in bad.text
        assert "set-cookie" not in bad.headers
        r = c.post("/login", data={"token": server.tokens["mara"]})
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"mlops_gpu_session={server.tokens['mara']};")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert "Secure" not in cookie  # plain HTTP here; set over HTTPS
        page = c.get("/")
        assert page.status_code == 200 and 'id="who">mara' in page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        # a login form posted from another site is refused (login CSRF)
        other = c.post("/login", data={"token": server.tokens["mara"]},
                       headers={"Origin": "https://evil.example"})  # fmt: skip
        assert other.status_code == 403 and "set-cookie" not in other.headers
        out = c.post("/logout")
        assert out.status_code == 303 and 'mlops_gpu_session=""' in out.headers["set-cookie"]


def test_hostile_run_names_render_as_text(server: Server) -> None:
    rid = submit(server, "mara", name=HOSTILE)
    with browser(server, "mara") as c:
        for path in ("/", "/runs", f"/runs?user={HOSTILE[:40]}"):
            text = c.get(path).text
            assert "<script>alert" not in text and "<img src=x" not in text, path
        assert str(escape(HOSTILE)) in c.get("/runs").text  # shown, as text
        assert rid in c.get("/").text
    no_5xx(server)


def test_each_role_sees_its_projects_and_cancel_only_where_allowed(server: Server) -> None:
    mine = submit(server, "mem", name="mem-job")
    other = submit(server, "qm", project="q", name="q-job")
    with browser(server, "vic") as c:  # viewer of p: sees p's runs, no cancel control
        for path in ("/", "/runs"):
            text = c.get(path).text
            assert mine in text and other not in text, path
            assert 'class="cancel"' not in text, path
    with browser(server, "peer") as c:  # member of p: may cancel only its own runs
        text = c.get("/").text
        assert mine in text and f'data-run="{mine}">Cancel' not in text
    with browser(server, "mem") as c:
        assert f'data-run="{mine}">Cancel' in c.get("/").text
    with browser(server, "nobody") as c:  # no role: no runs, and held GPUs name no run
        for path in PAGES:
            text = c.get(path).text
            assert mine not in text and other not in text, path
        assert "You have no role in any project" in c.get("/projects").text
    with browser(server, "mara") as c:  # maintainer of p
        text = c.get("/?project=q").text
        assert other not in text  # a project one cannot see filters to nothing
        assert f'data-run="{mine}">Cancel' in c.get("/").text
    no_5xx(server)


def test_cancel_checks_the_csrf_token_the_origin_and_the_role(server: Server) -> None:
    rid = submit(server, "mem", name="to-cancel")
    with browser(server, "vic") as c:  # a viewer has no cancel form, and a forged one fails
        assert 'name="csrf"' not in c.get("/").text
        r = c.post(f"/runs/{rid}/cancel", data={"csrf": "0" * 64, "next": "/"})
        assert r.status_code == 403
    assert phase(server, rid) == "pending"
    with browser(server, "mara") as c:
        good = csrf(c.get("/").text)
        assert c.post(f"/runs/{rid}/cancel", data={"next": "/"}).status_code == 403
        assert c.post(f"/runs/{rid}/cancel", data={"csrf": "0" * 64}).status_code == 403
        evil = c.post(f"/runs/{rid}/cancel", data={"csrf": good},
                      headers={"Origin": "https://evil.example"})  # fmt: skip
        assert evil.status_code == 403
        assert phase(server, rid) == "pending"
        # another session's token does not work for this one
        with browser(server, "root") as root:
            assert csrf(root.get("/").text) != good
        r = c.post(f"/runs/{rid}/cancel", data={"csrf": good, "next": "//evil.example/x"},
                   headers={"Origin": server.url})  # fmt: skip
        assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
    assert phase(server, rid) == "cancelled"
    from mlops_gpu.state import audit

    store = server.store()
    try:
        rows = [a for a in audit.read(store) if a.target == rid and "cancel" in a.action]
    finally:
        store.close()
    # every attempt is audited with its answer: the refused ones and the one that cancelled
    assert sorted(a.status for a in rows) == [200, 403, 403, 403, 403], rows
    assert {a.user for a in rows} == {"vic", "mara"}
    no_5xx(server)


def test_bad_query_values_answer_400_with_one_line(server: Server) -> None:
    with browser(server, "mara") as c:
        for path, what in (("/?page=x", "page: expected a whole number"),
                           ("/runs?phase=done", "phase: expected one of"),
                           ("/costs?days=9999", "days: expected a whole number from 1 to 366"),
                           ("/?user=" + "u" * 300, "user: at most 200 characters")):  # fmt: skip
            r = c.get(path)
            assert r.status_code == 400 and what in r.text, (path, r.text[-500:])
        assert c.post("/runs/..%2Fetc/cancel", data={}).status_code in (403, 404)
    no_5xx(server)


def test_trusted_proxy_mode_needs_no_login(make_server: Callable[..., Server]) -> None:
    auth = {"mode": "proxy", "trusted_proxies": ["127.0.0.1/32"],
            "proxy_header": "X-Auth-Request-Email"}  # fmt: skip
    srv = make_server(None, "--no-scheduler", extra={"server": {"auth": auth}})
    rid = submit(srv, "mem", name="via-proxy")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.get("/", headers={"X-Auth-Request-Email": "vic"})
        assert r.status_code == 200 and 'id="who">vic' in r.text and rid in r.text
        assert 'class="cancel"' not in r.text
        r = c.get("/", headers={"X-Auth-Request-Email": "mara"})
        token = csrf(r.text)
        assert 'id="logout"' not in r.text  # no session to end: the proxy logs in
        # the browser's origin is the proxy's (TLS ending there): its forwarded host counts
        proxied = {"X-Auth-Request-Email": "mara", "X-Forwarded-Host": "gpus.example.org",
                   "Origin": "https://gpus.example.org"}  # fmt: skip
        evil = {**proxied, "Origin": "https://evil.example"}
        r = c.post(f"/runs/{rid}/cancel", data={"csrf": token}, headers=evil)
        assert r.status_code == 403
        r = c.post(f"/runs/{rid}/cancel", data={"csrf": token, "next": "/runs"}, headers=proxied)
        assert r.status_code == 303 and r.headers["location"] == "/runs"
    assert phase(srv, rid) == "cancelled"
    no_5xx(srv)
