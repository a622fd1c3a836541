"""What the API processes of one server share (``server.shared``): the identity cache's
generation (a lookup begun before a membership change never serves its pre-change roles, in
any worker) and the rate limit (one token bucket per identity for all ``--workers``)."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Callable

import httpx

from mlops_gpu.server.auth import Identity, IdentityCache
from mlops_gpu.server.shared import SharedState
from team.conftest import Server, no_5xx

RUN = {"command": ["true"], "project": "p"}


def test_a_lookup_begun_before_an_invalidation_is_never_served() -> None:
    cache = IdentityCache()
    old = Identity("spare")
    gen = cache.generation()  # a store read begins ...
    cache.invalidate()  # ... a membership change commits and invalidates during it ...
    cache.put("t:x", old, gen)  # ... and the read ends with the pre-change roles
    assert cache.get("t:x") is None
    cache.put("t:y", old, cache.generation())
    assert cache.get("t:y") is old
    cache.invalidate()
    assert cache.get("t:y") is None


def test_an_invalidation_in_another_process_clears_this_cache() -> None:
    shared = SharedState.create()
    try:
        cache = IdentityCache(shared=shared)
        who = Identity("spare")
        cache.put("t:x", who, cache.generation())
        assert cache.get("t:x") is who
        gen = cache.generation()
        code = ("import sys; from mlops_gpu.server.auth import IdentityCache; "
                "from mlops_gpu.server.shared import SharedState; "
                "IdentityCache(shared=SharedState.attach(sys.argv[1])).invalidate()")  # fmt: skip
        subprocess.run([sys.executable, "-c", code, str(shared.path)], check=True, timeout=60)
        assert cache.get("t:x") is None
        cache.put("t:x", who, gen)  # read before the other process's change: not kept
        assert cache.get("t:x") is None
    finally:
        shared.close(remove=True)
    assert not shared.path.exists()  # type: ignore[union-attr]


def test_shared_buckets_across_processes_and_many_identities() -> None:
    shared = SharedState.create()
    other = SharedState.attach(shared.path)  # type: ignore[arg-type]
    try:
        now = 1000.0
        taken = [h.take("mem", 1.0, 3, now) for h in (shared, other, shared, other)]
        assert taken[:3] == [0.0, 0.0, 0.0] and taken[3] > 0  # one bucket of 3, not two
        assert other.take("mem", 1.0, 3, now + 1.0) == 0.0  # refilled at the rate
        # many identities: each keeps its own bucket (the table reuses only full ones)
        names = [f"user{i}" for i in range(5000)]
        assert all(shared.take(n, 1.0, 1, now) == 0.0 for n in names)
        assert all(other.take(n, 1.0, 1, now) > 0.0 for n in names)
    finally:
        other.close()
        shared.close(remove=True)


def _fresh(srv: Server, who: str, method: str, path: str, **kw: object) -> httpx.Response:
    """One request on a connection of its own (each may land on either worker)."""
    with srv.client(who) as c:
        return c.request(method, path, **kw)  # type: ignore[arg-type]


def test_workers_share_the_rate_limit(make_server: Callable[..., Server]) -> None:
    rate, burst = 1.0, 5
    srv = make_server(None, "--workers", "2", "--no-scheduler",
                      extra={"server": {"rate_per_s": rate, "rate_burst": burst}})  # fmt: skip
    start = time.monotonic()
    answers = [_fresh(srv, "mem", "GET", "/api/v1/runs") for _ in range(30)]
    elapsed = time.monotonic() - start
    ok = sum(1 for r in answers if r.status_code == 200)
    limited = [r for r in answers if r.status_code == 429]
    assert ok + len(limited) == 30, [r.status_code for r in answers]
    # one bucket: the burst and what the rate refilled meanwhile, not a burst per worker
    assert burst <= ok <= burst + math.floor(elapsed * rate), (ok, elapsed)
    assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
    assert _fresh(srv, "peer", "GET", "/api/v1/runs").status_code == 200  # per identity
    no_5xx(srv)


def test_a_membership_change_reaches_every_worker_at_once(
    make_server: Callable[..., Server],
) -> None:
    srv = make_server(None, "--workers", "2", "--no-scheduler",
                      extra={"server": {"rate_per_s": None}})  # fmt: skip
    rid = _fresh(srv, "mem", "POST", "/api/v1/runs", json=RUN).json()["id"]
    for _ in range(20):  # both workers cache spare's identity: no role in p
        assert _fresh(srv, "spare", "GET", f"/api/v1/runs/{rid}").status_code == 404
    r = _fresh(srv, "root", "PUT", "/api/v1/projects/p/members/spare", json={"role": "viewer"})
    assert r.status_code == 200, r.text
    # every request after the change's answer sees the new role, whichever worker serves it
    codes = [_fresh(srv, "spare", "GET", f"/api/v1/runs/{rid}").status_code for _ in range(20)]
    assert codes == [200] * 20, codes
    r = _fresh(srv, "root", "DELETE", "/api/v1/projects/p/members/spare")
    assert r.status_code == 200, r.text
    codes = [_fresh(srv, "spare", "GET", f"/api/v1/runs/{rid}").status_code for _ in range(20)]
    assert codes == [404] * 20, codes
    no_5xx(srv)
