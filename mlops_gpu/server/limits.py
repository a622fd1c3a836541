"""Limits on what one client can make the server do: a body size limit (``BodyLimit``, 413)
and a per-identity rate limit (``RateLimiter``, 429 with ``Retry-After``).

Invariants:
- A body over ``max_bytes`` is refused before a route acts on it: at once from its
  ``Content-Length``, else as soon as the bytes read pass the limit. A path in ``routes``
  (exact match) has its own limit and 413 message instead (``POST /runs/call``: callables).
- The rate limit is a token bucket per identity (``rate_per_s``, up to ``burst`` at once), kept
  in the server's ``SharedState``: one bucket per identity for every worker of
  ``server --workers N`` (not N buckets, which would let N times the rate through).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlops_gpu.server.errors import ApiError, body
from mlops_gpu.server.shared import SharedState


class BodyLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, routes: dict[str, tuple[int, str]] | None = None
    ) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.routes = routes or {}  # path -> (its limit, the 413's message)

    async def _refuse(self, send: Send, message: str) -> None:
        data = json.dumps(body("too_large", message)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": data})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, message = self.routes.get(scope.get("path", ""), (self.max_bytes, ""))
        message = message or f"request body over {limit} bytes"
        for k, v in scope["headers"]:
            if k == b"content-length" and (not v.isdigit() or int(v) > limit):
                await self._refuse(send, message)
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:  # (FastAPI lets an HTTPException through as it is)
                    raise HTTPException(413, message)
            return msg

        await self.app(scope, limited, send)


class RateLimiter:
    def __init__(self, rate_per_s: float, burst: int, shared: SharedState | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.rate, self.burst, self.clock = rate_per_s, burst, clock
        self.shared = shared if shared is not None else SharedState.private()

    def check(self, name: str) -> None:
        """Take one request from ``name``'s bucket; ApiError 429 when it is empty."""
        wait_s = self.shared.take(name, self.rate, self.burst, self.clock())
        if wait_s > 0.0:
            wait = max(1, math.ceil(wait_s))
            raise ApiError(429, "rate_limited", f"too many requests from {name}: retry in {wait}s",
                           headers={"Retry-After": str(wait)})  # fmt: skip
