"""Who looks at the dashboard: the browser's session cookie, or the trusted proxy's header.

The login page takes a bearer token (``mlops-gpu users add`` made it) and sets it as the
``mlops_gpu_session`` cookie: HttpOnly (scripts cannot read it), SameSite=Strict (another site's
page never sends it), Secure when the server speaks HTTPS, Path=/. Each request resolves the
cookie exactly as the API resolves ``Authorization: Bearer`` (``auth.token_identity``): a token
revoked or expired logs the browser out at its next request. In ``auth.mode: proxy`` the
proxy's header wins, as in the API, and no login is needed.

CSRF: every dashboard POST (login, logout, cancel) must come from a page of this server: an
``Origin`` header, when the browser sends one, must be this server's own; and a cancel carries
the per-session token ``csrf_token`` put in the page's form (an HMAC of the session, keyed by a
secret made at the server's start: another site can neither read nor forge it).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any
from urllib.parse import urlsplit

import anyio
from fastapi import Request

from mlops_gpu.server.auth import Identity, _trusted, proxy_identity, token_identity

COOKIE = "mlops_gpu_session"


#: The CSRF key shared by the API processes of one ``server --workers N`` (set by the parent,
#: hex): a form rendered by one worker is posted to any of them.
ENV_SECRET = "MLOPS_GPU_DASH_SECRET"


def secret(app: Any) -> bytes:
    key: bytes | None = getattr(app.state, "dash_secret", None)
    if key is None:
        shared = os.environ.get(ENV_SECRET)
        key = bytes.fromhex(shared) if shared else os.urandom(32)
        app.state.dash_secret = key
    return key


def _session_key(request: Request, who: Identity) -> str:
    # the cookie's token when there is one (a new login, a new CSRF token); the proxy's name
    return request.cookies.get(COOKIE) or f"proxy:{who.name}"


def _resolve(request: Request) -> Identity | None:
    who = proxy_identity(request)
    if who is not None:
        return who
    token = request.cookies.get(COOKIE, "")
    if not token or len(token) > 200:
        return None
    return token_identity(request.app.state.rt, token)


async def viewer(request: Request) -> Identity | None:
    """The request's identity, or None (the page redirects to the login); rate-limited per
    identity as the API is (429)."""
    who = await anyio.to_thread.run_sync(_resolve, request)
    if who is not None:
        request.state.identity = who
        limiter = request.app.state.limiter
        if limiter is not None:
            limiter.check(who.name)
    return who


def csrf_token(request: Request, who: Identity) -> str:
    key = _session_key(request, who).encode()
    return hmac.new(secret(request.app), b"csrf\0" + key, hashlib.sha256).hexdigest()


def csrf_ok(request: Request, who: Identity, sent: str) -> bool:
    return hmac.compare_digest(csrf_token(request, who), sent)


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from another origin (``Origin``, else
    ``Referer``); True when it says it comes from this server, or says nothing (a client
    that is not a browser). Through a trusted proxy (``auth.mode: proxy``) the browser's
    origin is the proxy's: its ``X-Forwarded-Host`` counts as this server, whatever the scheme
    (TLS may end at the proxy)."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return source is None
    parts = urlsplit(source)
    hosts = {request.headers.get("host", "")}
    auth = request.app.state.rt.cfg.server.auth
    client = request.client.host if request.client else None
    if auth.mode == "proxy" and _trusted(client, auth.trusted_proxies):
        hosts.add(request.headers.get("x-forwarded-host", "").split(",")[0].strip())
        return parts.netloc in hosts
    return parts.scheme == request.url.scheme and parts.netloc in hosts


def set_session(response: Any, request: Request, token: str) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")  # fmt: skip


def clear_session(response: Any, request: Request) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")  # fmt: skip
