"""Errors as JSON: ``{"error": {"code", "message", "field"}}`` for every failure, with the
HTTP status that fits; an unexpected exception is logged with its traceback on the server and
answered 500 ``internal`` with no detail (the traceback never reaches the client)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("mlops_gpu.server")

_CODES = {400: "bad_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found",
          405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported",
          422: "invalid", 429: "rate_limited", 503: "unavailable"}  # fmt: skip


class ApiError(Exception):
    """An answer other than success, raised anywhere in a route."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers


def body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}


def error_response(
    status: int, code: str, message: str, field: str | None = None, headers: Any = None
) -> JSONResponse:
    return JSONResponse(body(code, message, field), status_code=status, headers=headers)


async def send_error(send: Any, status: int, code: str, message: str, field: str | None = None,
                     headers: dict[str, str] | None = None) -> None:  # fmt: skip
    """The JSON error answered straight to an ASGI ``send`` (a middleware, outside FastAPI's
    exception handlers)."""
    data = json.dumps(body(code, message, field)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode("latin-1"), str(v).encode("latin-1"))
            for k, v in (headers or {}).items()]  # fmt: skip
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


def _field(loc: tuple[Any, ...]) -> str | None:
    # ("body", "runs", 0, "gpus") -> "runs.0.gpus"; ("query", "limit") -> "limit"
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "query", "path") else []
    return ".".join(parts) or None


def json_response(content: Any, status: int = 200) -> Response:
    """``content`` (JSON types only) as a JSON answer, written as it is: FastAPI's encoder,
    which a route's returned dict goes through, is most of the CPU of a large page."""
    data = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(data, status_code=status, media_type="application/json")


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_req: Request, e: ApiError) -> JSONResponse:
        return error_response(e.status, e.code, e.message, e.field, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, e: StarletteHTTPException) -> JSONResponse:
        code = _CODES.get(e.status_code, "error")
        msg = e.detail if isinstance(e.detail, str) else code.replace("_", " ")
        return error_response(e.status_code, code, msg, headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {}
        field = _field(tuple(first.get("loc", ())))
        # the message of pydantic, never the input (which may be huge or hostile)
        msg = str(first.get("msg", "invalid request"))[:500]
        if field is None and first.get("type") in ("model_attributes_type", "dict_type"):
            msg = "expected a JSON object (Content-Type: application/json)"
        more = f" (and {len(errs) - 1} more problems)" if len(errs) > 1 else ""
        return error_response(422, "invalid", f"{field or 'request'}: {msg}{more}", field)

    @app.exception_handler(Exception)
    async def _internal(req: Request, e: Exception) -> JSONResponse:
        from mlops_gpu.state import SetupError, StoreError

        if isinstance(e, StoreError | SetupError):
            log.error("store unavailable for %s %s: %s", req.method, req.url.path, e)
            return error_response(503, "unavailable", "the store is unavailable; retry later")
        log.exception("internal error for %s %s", req.method, req.url.path)
        return error_response(500, "internal", "internal error (logged by the server)")
