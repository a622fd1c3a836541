"""``POST /api/v1/runs/call`` authenticates before it reads its large body: a request without a
valid identity gets its 401 after the headers and a little of the body, the rest never sent
(the server did not wait for it, so it did not buffer it). An authenticated identity gets the
large limit, with every field but ``payload`` held to ``server.max_body_bytes``."""

from __future__ import annotations

import base64
import json
import pickle
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from conftest import run_cli

from team.conftest import Server, no_5xx

CALL = "/api/v1/runs/call"
DECLARED = 50_000_000  # Content-Length: over max_body_bytes, under the callable limit


def _partial_post(srv: Server, path: str, token: str | None, method: str = "POST") -> bytes:
    """Headers declaring a 50 MB body, then 1 KB of it; what the server answers (the socket
    stays open, nothing more is sent)."""
    url = urlsplit(srv.url)
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {url.hostname}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {DECLARED}\r\n\r\n")  # fmt: skip
    with socket.create_connection((url.hostname, url.port), timeout=20) as s:
        s.sendall(head.encode() + b'{"project": "p", "payload": "' + b"A" * 1000)
        data = b""
        while b"\r\n\r\n" not in data:  # a timeout here: the server waited for the body
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_no_identity_is_refused_before_the_body(make_server: Callable[..., Server]) -> None:
    srv = make_server(None, "--no-scheduler", extra={"server": {"max_body_bytes": 4096}})
    for token in (None, "not-a-token", ""):
        answer = _partial_post(srv, CALL, token)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]
        assert b"www-authenticate: bearer" in answer.lower()
        assert b"connection: close" in answer.lower()  # the rest of the body is not taken
    # another method on the path has the general limit, whoever asks
    answer = _partial_post(srv, CALL, srv.tokens["mem"], method="PUT")
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    deadline = time.monotonic() + 30  # the audit rows are written after the answers
    while True:
        out = run_cli("--config", str(srv.cfg), "audit", "--json")
        got = [(r["user"], r["action"], r["status"]) for r in json.loads(out.stdout)]
        if len(got) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got == [(None, "POST " + CALL, 401)] * 3 + [(None, "PUT " + CALL, 413)], got
    no_5xx(srv)


def test_the_fields_but_payload_are_held_to_the_general_limit(
    make_server: Callable[..., Server],
) -> None:
    srv = make_server(None, "--no-scheduler", extra={"server": {"max_body_bytes": 4096}})
    payload = base64.b64encode(pickle.dumps((len, ("x" * 20_000,), {}))).decode()
    with srv.client("mem") as c:
        r = c.post(CALL, json={"project": "p", "payload": payload})  # 27 KB: over 4096
        assert r.status_code == 201, r.text
        r = c.post(CALL, json={"project": "p", "payload": payload, "workdir": "/" + "w" * 4090})
        assert r.status_code == 413, r.text
        assert "(server.max_body_bytes)" in r.json()["error"]["message"]
        r = c.post(CALL, json={"project": "p", "payload": payload,
                               "env": {f"K{i}": "v" * 40 for i in range(100)}})  # fmt: skip
        assert r.status_code == 413, r.text
    assert srv.counts()[0] == 1
    no_5xx(srv)
