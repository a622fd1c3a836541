"""Limits on what one client can make the server do: a body size limit (``BodyLimit``, 413)
and a per-identity rate limit (``RateLimiter``, 429 with ``Retry-After``).

Invariants:
- A body over ``max_bytes`` is refused before a route acts on it: at once from its
  ``Content-Length``, else as soon as the bytes read pass the limit. A ``POST`` to a path in
  ``routes`` (exact match) has its own limit and 413 message instead (``POST /runs/call``:
  callables), granted only to an authenticated identity: ``gate`` (``auth.authenticate``)
  runs first, on the headers alone, and its 401 or 429 is answered before a byte of the body
  is read, with ``Connection: close``: the server closes the connection after it instead of
  taking the rest of the body.
- The bytes of the body read so far are in ``scope["state"][BODY_BYTES]`` (a route holds the
  parts of a large body to their own limits).
- The rate limit is a token bucket per identity (``rate_per_s``, up to ``burst`` at once), kept
  in the server's ``SharedState``: one bucket per identity for every worker of
  ``server --workers N`` (not N buckets, which would let N times the rate through).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlops_gpu.server.errors import ApiError, send_error
from mlops_gpu.server.shared import SharedState

log = logging.getLogger("mlops_gpu.server")

BODY_BYTES = "body_bytes"
#: an answer sent before the body was read ends the connection (the body is not read)
_CLOSE = {"Connection": "close"}


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        routes: dict[str, tuple[int, str]] | None = None,
        gate: Callable[[Scope], Awaitable[object]] | None = None,
    ) -> None:
        self.app, self.max_bytes, self.gate = app, max_bytes, gate
        self.routes = routes or {}  # path -> (its limit, the 413's message)

    async def _refuse(self, send: Send, message: str) -> None:
        await send_error(send, 413, "too_large", message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, message = self.max_bytes, ""
        route = self.routes.get(scope.get("path", "")) if scope["method"] == "POST" else None
        if route is not None:
            if self.gate is not None and not await self._passes(scope, send):
                return
            limit, message = route
        message = message or f"request body over {limit} bytes"
        req_state: dict[str, object] = scope.setdefault("state", {})
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
                req_state[BODY_BYTES] = seen
                if seen > limit:  # (FastAPI lets an HTTPException through as it is)
                    raise HTTPException(413, message)
            return msg

        await self.app(scope, limited, send)

    async def _passes(self, scope: Scope, send: Send) -> bool:
        """Whether the request's identity passed ``gate``; else its error was answered."""
        from mlops_gpu.state import SetupError, StoreError

        assert self.gate is not None
        try:
            await self.gate(scope)
            return True
        except ApiError as e:
            await send_error(send, e.status, e.code, e.message, e.field,
                             {**(e.headers or {}), **_CLOSE})  # fmt: skip
        except (StoreError, SetupError) as e:
            log.error("store unavailable for %s %s: %s", scope["method"], scope["path"], e)
            await send_error(send, 503, "unavailable", "the store is unavailable; retry later",
                             headers=_CLOSE)  # fmt: skip
        except Exception:
            log.exception("internal error for %s %s", scope["method"], scope["path"])
            await send_error(send, 500, "internal", "internal error (logged by the server)",
                             headers=_CLOSE)  # fmt: skip
        return False


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
