"""The hot path of ``POST /api/v1/runs``: a plain ASGI handler in front of the whole app.

Profiles of the server under 32 clients showed FastAPI's machinery per request (routing, the
dependency solver, the exception and exit-stack layers, Starlette's error and FastAPI's
telemetry middlewares, each wrapping ``send``) costing more CPU than the submit itself once
submits were group-committed. ``ServerApp`` (the app ``create_app`` builds) hands this handler
every ``POST /api/v1/runs`` before any of that; it answers the common case (a known identity,
a JSON object body within the size limit that validates) itself, with the route's own pieces:
``SubmitBody`` validated as FastAPI validates it (python mode, after ``json.loads``),
``identity``'s cache and rate limit, ``routes.runs._spec``, the group commit,
``run_to_public``.

Invariants:
- Its answers are the route's: anything it is not sure of (no valid identity, a body over the
  limit or not a JSON object or that does not validate, a client gone) goes to the whole app
  unchanged, with the body read so far handed on (``_replay``), so every refusal there (401,
  413, 422 with ``field``) is the app's, audited by its ``AuditTrail``.
- The body limit holds: a ``Content-Length`` over ``server.max_body_bytes`` (or not a number)
  goes to the app before a byte is read, and reading stops as soon as the bytes pass it.
- Every answer it sends is audited, as ``AuditTrail`` would (``audit.request_row``): a 201's row
  is stored in the transaction of the run (``submits.Submit.audit``: a 201 means the run and
  its row are committed); an error's row is written through the app's audit writer after the
  answer.
- A 201 is sent only after the run's batch committed (``group_commit``); an unexpected error is
  logged and answered 500 ``internal``, never with a traceback.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlops_gpu.server.audit import request_row, write_row
from mlops_gpu.server.errors import ApiError, body

log = logging.getLogger("mlops_gpu.server")
PATH = "/api/v1/runs"


class ServerApp(FastAPI):
    """FastAPI with ``fast`` (a ``FastSubmit``) answering ``POST /api/v1/runs`` in front of
    the middleware stack; every other request, and whatever ``fast`` hands back, goes through
    the whole app (``stack``)."""

    fast: FastSubmit | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.fast
        if (
            fast is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] == PATH
        ):
            await fast(scope, receive, send)
        else:
            await FastAPI.__call__(self, scope, receive, send)

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The whole app (its middlewares, routing and FastAPI's own layers)."""
        await FastAPI.__call__(self, scope, receive, send)


class FastSubmit:
    def __init__(self, app: ASGIApp, api: Any, max_bytes: int) -> None:
        #: ``app``: the whole app, for what this hands on; ``api``: the FastAPI app (its
        #: ``state``: runtime, caches, writers); ``max_bytes``: the body limit
        self.app, self.api, self.max_bytes = app, api, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for k, v in scope["headers"]:
            if k == b"content-length" and (not v.isdigit() or int(v) > self.max_bytes):
                await self.app(scope, receive, send)  # the app's BodyLimit answers the 413
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away: the app sees it too
                await self.app(scope, _replay(chunks, msg, receive), send)
                return
            chunk = msg.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = bool(msg.get("more_body", False))
            if size > self.max_bytes:  # the app's BodyLimit counts these bytes and refuses
                await self.app(scope, _replay(chunks, None, receive, more), send)
                return
            if not more:
                break
        req_state: dict[str, Any] = scope.setdefault("state", {})
        try:
            handled = await self._submit(scope, req_state, b"".join(chunks), send)
        except ApiError as e:
            await _send(send, e.status, body(e.code, e.message, e.field), e.headers)
            await write_row(self.api.state.audit_writer, scope,
                            request_row(scope, req_state, e.status))  # fmt: skip
            return
        if not handled:
            await self.app(scope, _replay(chunks, None, receive), send)

    async def _submit(self, scope: Scope, req_state: dict[str, Any], data: bytes,
                      send: Send) -> bool:  # fmt: skip
        """Whether it answered; ApiError: the error to answer (and audit)."""
        from mlops_gpu.controller import SubmitError
        from mlops_gpu.model.public import run_to_public
        from mlops_gpu.server.auth import _load, cached, first_headers, key_of
        from mlops_gpu.server.routes.runs import _spec
        from mlops_gpu.server.schemas import SubmitBody
        from mlops_gpu.server.submits import Submit
        from mlops_gpu.state import SetupError, StoreError

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
        who = cached(state, key, secret)
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
        req_state["identity"] = who
        try:
            if state.limiter is not None:
                state.limiter.check(who.name)
            spec = _spec(state.rt, sub, who, "")
            # the row of the 201, stored with the run (its target: the run's id); an error's
            # row has no detail, as the route's
            row = request_row(scope, {**req_state, "audit_detail": f"project {spec.project}"}, 201)
            run = await state.submits.put(Submit(spec, row))
        except ApiError:
            raise
        except SubmitError as e:
            raise ApiError(422, "rejected", str(e)) from None
        except (StoreError, SetupError) as e:
            log.error("store unavailable for POST %s: %s", PATH, e)
            raise ApiError(503, "unavailable", "the store is unavailable; retry later") from None
        except Exception:
            log.exception("internal error for POST %s", PATH)
            raise ApiError(500, "internal", "internal error (logged by the server)") from None
        req_state["audit_target"] = run.id
        req_state["audit_detail"] = f"project {run.project}"
        await _send(send, 201, run_to_public(run))
        return True


def _replay(chunks: list[bytes], last: Message | None, receive: Receive,
            more: bool = False) -> Receive:  # fmt: skip
    """A ``receive`` that gives the body read so far again (``more``: the client has more of
    it), then what the client sends."""
    pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks),
                               "more_body": more}]  # fmt: skip
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
