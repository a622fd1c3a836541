"""Two servers on one store: both serve the API, exactly one schedules (the store's leader
lease); when the leader is SIGKILLed, the other takes over scheduling and runs submitted to it
are admitted. (The fail-over under load with 200 runs is issue 26's later slice.)"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from team.conftest import Server, start_server, stop_server

RUN = {"command": ["true"], "project": "p"}


def _role(srv: Server) -> str:
    with srv.client("mem") as c:
        return str(c.get("/api/v1/scheduler").json()["this_server"])


def test_one_leader_and_the_standby_takes_over(
    make_server: Callable[..., Server], store_url: str
) -> None:
    first = make_server(store_url)
    second = start_server(first.cfg)
    second.tokens = first.tokens
    try:
        deadline = time.monotonic() + 30
        while _role(first) != "leader":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert _role(second) == "standby"
        with second.client("mem") as c:  # the standby serves the API; the leader schedules
            rid = c.post("/api/v1/runs", json=RUN).json()["id"]
            while c.get(f"/api/v1/runs/{rid}").json()["phase"] != "succeeded":
                assert time.monotonic() < deadline
                time.sleep(0.2)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        t0 = time.monotonic()
        while _role(second) != "leader":
            assert time.monotonic() - t0 < 40, "the standby did not take over"
            time.sleep(0.2)
        with second.client("mem") as c:
            rid = c.post("/api/v1/runs", json=RUN).json()["id"]
            while c.get(f"/api/v1/runs/{rid}").json()["phase"] != "succeeded":
                assert time.monotonic() - t0 < 60
                time.sleep(0.2)
    finally:
        stop_server(second)
