"""Hostile input and limits (body size, rate limit, JSON errors without tracebacks, run ids,
CORS off, TLS) and the audit trail of mutating requests (``mlops-gpu audit``)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from conftest import run_cli

from team.conftest import Server, no_5xx

RUN = {"command": ["true"], "project": "p"}


def test_body_limit_errors_and_cors(make_server: Callable[..., Server]) -> None:
    srv = make_server(None, "--no-scheduler", extra={"server": {"max_body_bytes": 4096}})
    with srv.client("mem") as c:
        big = {**RUN, "name": "x" * 5000}
        r = c.post("/api/v1/runs", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"

        def chunks():  # no Content-Length: the limit counts the bytes as they come
            yield b'{"command": ["true"], "project": "p", "name": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}'

        r = c.post("/api/v1/runs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        r = c.post(
            "/api/v1/runs", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 422 and set(r.json()["error"]) == {"code", "message", "field"}
        r = c.post("/api/v1/runs", json={**RUN, "gpus": "4"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "gpus", r.text
        r = c.post("/api/v1/runs", json={**RUN, "bogus": 1})
        assert r.status_code == 422 and r.json()["error"]["field"] == "bogus"
        for bad in ("..%2F..%2Fetc%2Fpasswd", "r%00aaaaaaaaa", "R0123456789", "r012345678g",
                    "r" + "0" * 11, "%2e%2e"):  # fmt: skip
            r = c.get(f"/api/v1/runs/{bad}")
            assert r.status_code in (404, 422), (bad, r.text)
            assert "error" in r.json()
        assert c.get("/api/v1/nope").json()["error"]["code"] == "not_found"
        assert c.delete("/api/v1/runs").json()["error"]["code"] == "method_not_allowed"
        # CORS is off: no browser of another origin may read answers
        ask = {"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}
        pre = c.options("/api/v1/runs", headers=ask)
        assert "access-control-allow-origin" not in pre.headers
        got = c.get("/api/v1/runs", headers={"Origin": "https://evil.example"})
        assert got.status_code == 200 and "access-control-allow-origin" not in got.headers
    assert srv.counts() == (0, 0)
    no_5xx(srv)


def test_rate_limit_answers_429_with_retry_after(make_server: Callable[..., Server]) -> None:
    srv = make_server(None, "--no-scheduler",
                      extra={"server": {"rate_per_s": 1.0, "rate_burst": 3}})  # fmt: skip
    with srv.client("mem") as c, srv.client("peer") as other:
        codes = [c.get("/api/v1/runs").status_code for _ in range(5)]
        assert codes[:3] == [200, 200, 200] and 429 in codes[3:], codes
        r = c.get("/api/v1/runs")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limited"
        assert other.get("/api/v1/runs").status_code == 200  # per identity
        time.sleep(float(r.headers["retry-after"]) + 0.1)
        assert c.get("/api/v1/runs").status_code == 200


def test_tls(make_server: Callable[..., Server], tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    srv = make_server(None, "--no-scheduler", "--certfile", str(cert), "--keyfile", str(key),
                      scheme="https")  # fmt: skip
    with srv.client("mem") as c:
        assert c.get("/api/v1/runs").status_code == 200
    import httpx

    plain = srv.url.replace("https://", "http://")
    try:
        r = httpx.get(plain + "/livez", timeout=5)
        assert r.status_code >= 400  # plain HTTP is not served
    except httpx.HTTPError:
        pass


def test_every_mutating_request_is_audited(make_server: Callable[..., Server]) -> None:
    srv = make_server(None, "--no-scheduler")
    with srv.client("mem") as c, srv.client() as anon, srv.client("vic") as vic:
        rid = c.post("/api/v1/runs", json=RUN).json()["id"]
        assert c.post(f"/api/v1/runs/{rid}/cancel").status_code == 200
        assert vic.post("/api/v1/runs", json=RUN).status_code == 403
        assert anon.post("/api/v1/runs", json=RUN).status_code == 401
        assert c.post("/api/v1/runs", json={**RUN, "gpus": -1}).status_code == 422
        assert c.get("/api/v1/runs").status_code == 200  # a read: not audited
    out = run_cli("--config", str(srv.cfg), "audit", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    got = [(r["user"], r["action"], r["target"], r["status"]) for r in rows]
    assert got == [
        ("mem", "POST /api/v1/runs", rid, 201),
        ("mem", f"POST /api/v1/runs/{rid}/cancel", rid, 200),
        ("vic", "POST /api/v1/runs", None, 403),
        (None, "POST /api/v1/runs", None, 401),
        ("mem", "POST /api/v1/runs", None, 422),
    ]
    assert all(r["client"] == "127.0.0.1" and r["time"].endswith("Z") for r in rows)
    assert rows[1]["detail"] == "cancelled"
    mine = json.loads(run_cli("--config", str(srv.cfg), "audit", "--user", "vic", "--json").stdout)
    assert [r["status"] for r in mine] == [403]
    recent = run_cli("--config", str(srv.cfg), "audit", "--since", "1h")
    assert recent.returncode == 0 and len(recent.stdout.strip().splitlines()) == 5
    time.sleep(1.1)
    none = json.loads(run_cli("--config", str(srv.cfg), "audit", "--since", "1s", "--json").stdout)
    assert none == []
