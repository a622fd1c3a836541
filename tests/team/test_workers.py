"""``mlops-gpu server --workers 2``: two API processes on one port, the scheduler in the parent;
the workers tell its role from the store's lease, and a run submitted through them runs."""

from __future__ import annotations

import time
from collections.abc import Callable

from team.conftest import Server

RUN = {"command": ["true"], "project": "p"}


def test_two_api_workers_and_one_scheduler(make_server: Callable[..., Server]) -> None:
    srv = make_server(None, "--workers", "2")
    with srv.client("mem") as c:
        deadline = time.monotonic() + 60
        while c.get("/api/v1/scheduler").json()["this_server"] != "leader":
            assert time.monotonic() < deadline, "the parent's scheduler never led"
            time.sleep(0.2)
        ids = []
        for _ in range(6):  # a connection each: they land on either worker
            with srv.client("mem") as one:
                r = one.post("/api/v1/runs", json=RUN)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        for rid in ids:
            while c.get(f"/api/v1/runs/{rid}").json()["phase"] != "succeeded":
                assert time.monotonic() < deadline + 60, c.get(f"/api/v1/runs/{rid}").text
                time.sleep(0.2)
    assert srv.counts()[0] == 6
