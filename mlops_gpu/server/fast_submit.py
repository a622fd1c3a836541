"""The hot path of ``POST /api/v1/runs``: a plain ASGI handler in front of FastAPI's routing.

Profiles of the server under 32 clients showed FastAPI's machinery per request (routing, the
dependency solver, the exception and exit-stack layers) costing more CPU than the submit itself
once submits were group-committed. This handler answers the common case (a known identity, a
JSON object body that validates) itself, with the route's own pieces: ``SubmitBody``
validated as FastAPI validates it (python mode, after ``json.loads``), ``identity``'s cache and
rate limit, ``routes.runs._spec``, the group commit, ``run_to_public``.

Invariants:
- Its answers are the route's: anything it is not sure of (another path or method, no valid
  identity, a body that is not a JSON object or does not validate) goes to FastAPI unchanged
  (the body it read is handed on), so every error shape (401, 422 with ``field``) is FastAPI's.
- It sits inside the body limit and the audit trail (``create_app`` adds it first): a fast
  submit is bounded and audited like any other, and sets the same ``identity``,
  ``audit_target`` and ``audit_detail``.
- A 201 is sent only after the run's batch committed (``group_commit``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlops_gpu.server.errors import _CODES, ApiError, body

log = logging.getLogger("mlops_gpu.server")
PATH = "/api/v1/runs"


class FastSubmit:
    def __init__(self, app: ASGIApp, api: Any) -> None:
        #: ``api``: the FastAPI app (its ``state``: runtime, caches, writers)
        self.app, self.api = app, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            try:
                msg = await receive()
            except HTTPException as e:  # the body limit's 413, past a route's handlers here
                await _send(send, e.status_code, body(_CODES.get(e.status_code, "error"),
                                                      str(e.detail)))  # fmt: skip
                return
            if msg["type"] != "http.request":  # the client went away: FastAPI sees it too
                await self.app(scope, _replay(chunks, msg, receive), send)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        try:
            handled = await self._submit(scope, b"".join(chunks), send)
        except ApiError as e:
            await _send(send, e.status, body(e.code, e.message, e.field), e.headers)
            return
        if not handled:
            await self.app(scope, _replay(chunks, None, receive), send)

    async def _submit(self, scope: Scope, data: bytes, send: Send) -> bool:
        """Whether it answered; ApiError: the route's error answer."""
        from mlops_gpu.controller import SubmitError
        from mlops_gpu.model.public import run_to_public
        from mlops_gpu.server.auth import _load, first_headers, key_of
        from mlops_gpu.server.routes.runs import _spec
        from mlops_gpu.server.schemas import SubmitBody

        state = self.api.state
        headers = first_headers(scope["headers"])
        # exactly FastAPI's JSON media type test (``application/json`` or ``*/*+json``): any
        # other type is the route's to refuse
        media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if media != b"application/json" and not (media.startswith(b"application/")
                                                 and media.endswith(b"+json")):  # fmt: skip
            return False
        try:
            key, secret = key_of(state.rt.cfg.server.auth, scope.get("client"), headers)
        except ApiError:
            return False  # (FastAPI answers the 401 the same way, and audits it)
        who = state.identities.get(key)
        if who is None:
            # read from the store and cached as the route's dependency does: every client's
            # identity expires each TTL, and sending those requests through FastAPI's routing
            # cost a burst of slow answers every TTL (the submit p99)
            try:
                who = await anyio.to_thread.run_sync(_load, state.rt, state.identities, key, secret)
            except Exception:  # an unknown token (401), the store unavailable (503), ...:
                return False  # the route reads it again and answers (and audits) its own way
        try:
            obj = json.loads(data)
            sub = SubmitBody.model_validate(obj) if isinstance(obj, dict) else None
        except (ValueError, RecursionError, ValidationError):  # (deep nesting: RecursionError)
            sub = None
        if sub is None or sub.job_fields():  # arrays, dependencies, holds: the route's own path
            return False
        req_state: dict[str, Any] = scope.setdefault("state", {})
        req_state["identity"] = who
        if state.limiter is not None:
            state.limiter.check(who.name)
        spec = _spec(state.rt, sub, who, "")
        try:
            run = await state.submits.put(spec)
        except SubmitError as e:
            raise ApiError(422, "rejected", str(e)) from None
        except Exception as e:
            from mlops_gpu.state import SetupError, StoreError

            if isinstance(e, StoreError | SetupError):
                log.error("store unavailable for POST %s: %s", PATH, e)
                msg = "the store is unavailable; retry later"
                raise ApiError(503, "unavailable", msg) from None
            log.exception("internal error for POST %s", PATH)
            raise ApiError(500, "internal", "internal error (logged by the server)") from None
        req_state["audit_target"] = run.id
        req_state["audit_detail"] = f"project {run.project}"
        await _send(send, 201, run_to_public(run))
        return True


def _replay(chunks: list[bytes], last: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read so far again, then what the client sends."""
    pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks),
                               "more_body": False}]  # fmt: skip
    if last is not None:
        pending = [last]  # a disconnect: the route sees it, as without this handler

    async def again() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return again


async def _send(send: Send, status: int, content: Any, headers: Any = None) -> None:
    data = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})
