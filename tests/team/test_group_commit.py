"""``GroupCommit`` (concurrent writes in one call, each caller answered with its own result or
exception after the call returned) and ``IdentityCache`` (kept at most its TTL, never past the
token's expiry), without a server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from mlops_gpu.server.auth import Identity, IdentityCache
from mlops_gpu.server.group_commit import GroupCommit


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
