"""``GroupCommit`` (concurrent writes in one call, each caller answered with its own result or
exception after the call returned), ``IdentityCache`` (kept at most its TTL, never past the
token's expiry; read ahead before it expires) and submits stored with their audit rows in one
transaction, without a server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from mlops_gpu.config import load_config
from mlops_gpu.controller import Runtime
from mlops_gpu.server.auth import (
    Identity,
    IdentityCache,
    IdentityRefresh,
    _load,
    cached,
    key_of,
)
from mlops_gpu.server.group_commit import GroupCommit
from mlops_gpu.server.submits import Submit, submit_writer
from mlops_gpu.state import audit
from mlops_gpu.state.schema import audit as audit_table
from mlops_gpu.state.schema import runs
from mlops_gpu.state.users import add_user, revoke, set_membership, token_user, token_users
from mlops_gpu.testing import config_yaml, make_spec


def test_concurrent_items_share_a_write_and_each_gets_its_own_result() -> None:
    gate = threading.Event()
    calls: list[list[int]] = []

    def write(items: Sequence[int]) -> list[int | BaseException]:
        gate.wait(5)  # the first batch holds the writer while the others queue up
        calls.append(list(items))
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]

    gc: GroupCommit[int, int] = GroupCommit(write, name="test")

    async def main() -> list[int | BaseException]:
        tasks = [asyncio.ensure_future(gc.put(i)) for i in range(20)]
        await asyncio.sleep(0.2)
        gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        out = asyncio.run(main())
    finally:
        gc.close()
    assert [o if isinstance(o, int) else str(o) for o in out] == [
        i * 10 if i % 2 == 0 else f"odd {i}" for i in range(20)
    ]
    assert sorted(i for c in calls for i in c) == list(range(20))
    assert len(calls) < 20  # batched: fewer writes than items
    assert gc.items == 20 and gc.batches == len(calls)


def test_a_failed_write_fails_every_item_of_its_batch() -> None:
    def write(items: Sequence[str]) -> list[str | BaseException]:
        raise RuntimeError("store down")

    gc: GroupCommit[str, str] = GroupCommit(write, name="test")

    async def main() -> list[str | BaseException]:
        return await asyncio.gather(*(gc.put(x) for x in "abc"), return_exceptions=True)

    try:
        out = asyncio.run(main())
    finally:
        gc.close()
    assert [str(o) for o in out] == ["store down"] * 3
    with pytest.raises(RuntimeError, match="stopping"):
        asyncio.run(gc.put("d"))


def test_identity_cache_expires_with_its_ttl_or_the_token() -> None:
    now = [100.0]
    cache = IdentityCache(ttl_s=2.0, max_size=3, clock=lambda: now[0])
    who = Identity("mem", roles={"p": "member"})
    gen = cache.generation()
    cache.put("t:a", who, gen)
    cache.put("t:b", who, gen, expires_at=101.0)  # the token expires before the TTL
    assert cache.get("t:a") is who and cache.get("t:b") is who
    now[0] = 101.0
    assert cache.get("t:a") is who and cache.get("t:b") is None
    now[0] = 102.0
    assert cache.get("t:a") is None
    for k in ("t:1", "t:2", "t:3", "t:4"):  # bounded
        cache.put(k, who, gen)
    assert cache.get("t:1") is None and cache.get("t:4") is who


def test_an_identity_lives_its_ttl_from_when_its_read_began() -> None:
    # a read that began at 100 and ended (after a wait for a thread) at 101.5: a revocation
    # committed just after its snapshot must still take effect by 102, not by 103.5
    now = [101.5]
    cache = IdentityCache(ttl_s=2.0, clock=lambda: now[0])
    cache.put("t:a", Identity("mem"), cache.generation(), read_at=100.0)
    now[0] = 101.9
    assert cache.get("t:a") is not None
    now[0] = 102.0
    assert cache.get("t:a") is None


def test_identity_cache_says_when_an_entry_is_due_to_be_read_again() -> None:
    now = [100.0]
    cache = IdentityCache(ttl_s=2.0, clock=lambda: now[0])
    who = Identity("mem")
    cache.put("t:a", who, cache.generation())
    assert not cache.due("t:a") and not cache.due("t:unknown")
    now[0] = 101.2  # the last second of its two: still served, and due
    assert cache.get("t:a") is who and cache.due("t:a")
    cache.drop("t:a")
    assert cache.get("t:a") is None


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    data = yaml.safe_load(config_yaml(projects={"p": (4, 0), "q": (4, 0)}))
    data["store"] = store_url
    data["mlflow"] = {"enabled": False}
    data["state_dir"] = str(tmp_path / "state")
    data["projects"]["q"]["members"] = {"mem": "viewer"}
    (tmp_path / "mlops-gpu.yaml").write_text(yaml.safe_dump(data))
    runtime = Runtime(load_config(tmp_path / "mlops-gpu.yaml"))
    yield runtime
    runtime.close()


def test_token_users_reads_many_tokens_as_token_user_reads_each(rt: Runtime) -> None:
    toks = [add_user(rt.store, n, admin=n == "root", projects={"p": "member"}, ttl_s=3600)
            for n in ("mem", "peer", "root")]  # fmt: skip
    gone = add_user(rt.store, "gone", admin=False, projects={}, ttl_s=3600)
    revoke(rt.store, "gone")
    expired = add_user(rt.store, "old", admin=False, projects={}, ttl_s=60, now=time.time() - 61)
    asked = [*toks, gone, expired, "mgt_unknown", "not-a-token"]
    got = token_users(rt.store, asked)
    assert set(got) == set(toks)
    for t in asked:
        assert got.get(t) == token_user(rt.store, t)


def test_identities_are_read_ahead_and_revocations_still_count(rt: Runtime) -> None:
    tok = add_user(rt.store, "mem", admin=False, projects={"p": "member"}, ttl_s=3600)
    now = [1000.0]
    state = type("State", (), {})()
    state.rt = rt
    state.identities = IdentityCache(ttl_s=2.0, clock=lambda: now[0])
    state.identity_refresh = IdentityRefresh(rt, state.identities)
    key, secret = key_of(rt.cfg.server.auth, None, {b"authorization": f"Bearer {tok}".encode()})
    who = _load(rt, state.identities, key, secret)
    assert who.roles == {"p": "member", "q": "viewer"}  # stored, and the config's members

    async def request() -> Identity | None:
        got = cached(state, key, secret)
        task = state.identity_refresh._task
        if task is not None:
            await task  # (a request does not wait for it: the test does, to see its effect)
        return got

    assert asyncio.run(request()) == who and state.identity_refresh._task is None  # not due
    set_membership(rt.store, "mem", "p", "maintainer")
    now[0] = 1001.5  # due: served as cached, and read again behind it
    assert asyncio.run(request()) == who
    now[0] = 1003.0  # past the first read's TTL, within the second's
    assert asyncio.run(request()) == Identity("mem", False, {"p": "maintainer", "q": "viewer"})
    revoke(rt.store, "mem")
    now[0] = 1004.8  # due again: the read ahead finds the token revoked and forgets it
    asyncio.run(request())
    assert state.identities.get(key) is None


def test_a_submit_and_its_audit_row_are_one_transaction(rt: Runtime) -> None:
    spec = make_spec("p", 1, name="a")
    row = audit.entry_row(user="mem", action="POST /api/v1/runs", target=None,
                          client="127.0.0.1", status=201, detail="project p")  # fmt: skip
    with pytest.raises(ValueError, match="audit rows"):  # a bad batch: nothing of it stored
        rt.store.submit_many([spec, spec], audit=[row])
    stored = rt.store.submit_many([spec, spec], audit=[row, None])
    with rt.store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == 2
        rows = conn.execute(select(audit_table)).all()
    assert [(r.user, r.target, r.status, r.detail) for r in rows] == [
        ("mem", stored[0].id, 201, "project p")
    ]


def test_the_submit_writer_stores_each_request_with_its_audit_row(rt: Runtime) -> None:
    row = audit.entry_row(user="mem", action="POST /api/v1/runs", target=None,
                          client="127.0.0.1", status=201, detail="project p")  # fmt: skip
    writer = submit_writer(rt)

    async def main() -> list[object]:
        items = [Submit(make_spec("p", 1), row), Submit(make_spec("p", 64), row),
                 Submit(make_spec("p", 1))]  # fmt: skip
        return await asyncio.gather(*(writer.put(i) for i in items), return_exceptions=True)

    try:
        ok, refused, routed = asyncio.run(main())
    finally:
        writer.close()
    assert "rejected" in str(refused)  # 64 GPUs never fit: its request answers (and audits)
    with rt.store.engine.connect() as conn:
        targets = [r.target for r in conn.execute(select(audit_table))]
    assert targets == [ok.id]  # type: ignore[attr-defined]
    assert rt.store.get(routed.id) is not None  # type: ignore[attr-defined]
