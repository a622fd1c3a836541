"""Who makes a request (``identity``, a FastAPI dependency of every ``/api/v1`` route) and what
that identity may do (``Identity``).

Identity: ``Authorization: Bearer <token>`` (``state.users``), or in ``auth.mode: proxy`` the
configured header, believed only on a connection from one of ``auth.trusted_proxies``.

Roles: ``admin`` may do everything. Per project (the config's ``projects.NAME.members`` and the
store's memberships; the higher role wins): ``viewer`` reads the project's runs, ``member``
also submits to it and cancels its own runs, ``maintainer`` also cancels any of its runs.
Without a role in a project its runs do not exist for the identity (404, never 403).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import Request

from mlops_gpu.config.server import ROLE_RANK
from mlops_gpu.model import Run
from mlops_gpu.server.errors import ApiError
from mlops_gpu.server.shared import SharedState
from mlops_gpu.state import users as users_mod

log = logging.getLogger("mlops_gpu.server")


@dataclass(frozen=True)
class Identity:
    name: str
    admin: bool = False
    roles: Mapping[str, str] = field(default_factory=dict)  # project -> role

    def role(self, project: str) -> str | None:
        return self.roles.get(project)

    def visible_projects(self) -> set[str] | None:
        """Projects whose runs this identity sees (None: all, an admin)."""
        return None if self.admin else set(self.roles)

    def can_see(self, project: str) -> bool:
        return self.admin or project in self.roles

    def can_submit(self, project: str) -> bool:
        return self.admin or ROLE_RANK.get(self.roles.get(project, ""), 0) >= ROLE_RANK["member"]

    def can_cancel(self, run: Run) -> bool:
        return self.can_cancel_of(run.project, run.spec.user)

    def can_cancel_of(self, project: str, user: str) -> bool:
        """Whether this identity may cancel a run of ``project`` submitted by ``user``."""
        role = self.roles.get(project)
        if self.admin or role == "maintainer":
            return True
        return role == "member" and user == self.name


def _merged_roles(config_members: dict[str, dict[str, str]], stored: Mapping[str, str],
                  name: str) -> dict[str, str]:  # fmt: skip
    out = dict(stored)
    for project, members in config_members.items():
        role = members.get(name)
        if role is not None and ROLE_RANK[role] > ROLE_RANK.get(out.get(project, ""), 0):
            out[project] = role
    return out


def _trusted(client: str | None, networks: list[str]) -> bool:
    if client is None:
        return False
    try:
        addr = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(n, strict=False) for n in networks)


def _members(rt: Any) -> dict[str, dict[str, str]]:
    return {p: dict(c.members) for p, c in rt.cfg.projects.items()}


def _of(rt: Any, name: str, user: Any | None) -> Identity:
    """The identity called ``name`` (its stored user, if any): admin from the store, project
    roles from the config's members and the stored memberships (the higher wins)."""
    stored = user.projects if user else {}
    return Identity(name, bool(user and user.admin), _merged_roles(_members(rt), stored, name))


def proxy_identity(request: Request) -> Identity | None:
    """In ``auth.mode: proxy``, the identity the trusted proxy names; else None (the web
    dashboard's sessions; read from the store on each call, not cached)."""
    try:
        key, name = _key(request)
    except ApiError:  # no credentials at all
        return None
    if not key.startswith("p:"):  # a bearer token, not a trusted proxy's header
        return None
    rt = request.app.state.rt
    return _of(rt, name, users_mod.get_user(rt.store, name))


def token_identity(rt: Any, token: str) -> Identity | None:
    """The identity a bearer token belongs to (None: unknown, expired or revoked), read from
    the store (the web dashboard's sessions: a revoked token ends its session at once)."""
    user = users_mod.authenticate(rt.store, token.strip())
    return None if user is None else _of(rt, user.name, user)


#: Seconds an identity read from the store serves requests of the same token (or proxied
#: name) before it is read again: a revocation (``users revoke``), an expired user or a
#: changed membership takes effect within this long in every server; a membership changed
#: through this server's API (any of its workers) at once.
IDENTITY_TTL_S = 2.0


class IdentityCache:
    """Identities by token hash (``t:...``) or proxied name (``p:...``), each kept at most
    ``ttl_s`` and never past its token's expiry. Bounded: cleared when it grows past
    ``max_size``.

    Generations (``invalidate``): each entry carries the generation of ``shared`` read before
    its store read began (``generation``, passed to ``put``), and is served only while the
    generation is still that one. ``invalidate`` (after a membership change committed) adds
    one to it in every worker that shares ``shared``: every entry cached before, and every
    store read in flight during the change, is never served, so no pre-change role comes
    back.

    Read ahead (``due``, ``IdentityRefresh``): an entry in the last ``refresh_s`` of its life
    is still served, and read again in the background, so that a busy client's identity is
    renewed before it expires instead of its requests waiting for the read (every client's
    entry expiring at once made a burst of slow answers each TTL). An entry is never served
    past its ``ttl_s`` from the read that made it, so revocations count as before."""

    def __init__(self, ttl_s: float = IDENTITY_TTL_S, max_size: int = 10_000,
                 clock: Callable[[], float] = time.time,
                 shared: SharedState | None = None) -> None:  # fmt: skip
        self.ttl_s, self.max_size, self.clock = ttl_s, max_size, clock
        self.shared = shared if shared is not None else SharedState.private()
        # key -> (valid until, generation it was read under, identity)
        self._items: dict[str, tuple[float, int, Identity]] = {}
        self.refresh_s = ttl_s / 2

    def generation(self) -> int:
        """Read before a store read whose identity is then ``put``."""
        return self.shared.generation()

    def get(self, key: str) -> Identity | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        if hit[0] <= self.clock() or hit[1] != self.shared.generation():
            self._items.pop(key, None)
            return None
        return hit[2]

    def due(self, key: str) -> bool:
        """Whether ``key``'s entry (served now) is in the last ``refresh_s`` of its life."""
        hit = self._items.get(key)
        return hit is not None and hit[0] - self.clock() < self.refresh_s

    def drop(self, key: str) -> None:
        """Forget ``key`` (its token no longer authenticates: the next request reads it)."""
        self._items.pop(key, None)

    def put(self, key: str, who: Identity, generation: int, expires_at: float | None = None,
            read_at: float | None = None) -> None:  # fmt: skip
        """Cache ``who``, read from the store after ``generation`` was read (a read that
        began before an invalidation is not kept). ``read_at``: the clock when that read
        began; the entry lives ``ttl_s`` from then, not from its end, so that a revocation
        committed just after the read's snapshot is honoured within ``ttl_s`` however long
        the read (and its wait for a thread) took."""
        if generation != self.shared.generation():
            return
        if len(self._items) >= self.max_size:
            self._items.clear()
        until = (self.clock() if read_at is None else read_at) + self.ttl_s
        until = until if expires_at is None else min(until, expires_at)
        self._items[key] = (until, generation, who)

    def invalidate(self) -> None:
        """Forget every identity, in every worker sharing this cache's generation."""
        self.shared.bump()
        self._items.clear()


def key_of(auth: Any, client: Any, headers: Mapping[bytes, bytes]) -> tuple[str, str]:
    """(cache key, token or proxied name) of a request's credentials; 401 without any.
    ``client``: the ASGI scope's (host, port) or None; ``headers``: lower-case names to the
    first value of each (as Starlette's ``Request.headers.get``)."""
    host = client[0] if client else None
    if auth.mode == "proxy" and _trusted(host, auth.trusted_proxies):
        raw = headers.get(auth.proxy_header.lower().encode("latin-1"), b"")
        name = raw.decode("latin-1").strip()
        if name and len(name) <= 200:
            return "p:" + name, name
    header = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "unauthenticated", "no credentials: send Authorization: Bearer TOKEN",
                       headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthenticated", "malformed Authorization header: expected "
                       "Bearer TOKEN", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    token = token.strip()
    return "t:" + users_mod.token_hash(token), token


def first_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """An ASGI scope's headers, the first value of each name."""
    out: dict[bytes, bytes] = {}
    for k, v in raw:
        out.setdefault(k, v)
    return out


def _key(request: Request) -> tuple[str, str]:
    auth = request.app.state.rt.cfg.server.auth
    return key_of(auth, request.scope.get("client"), first_headers(request.scope["headers"]))


#: ``scope["state"]`` key: the request's identity was established and rate-limited already
#: (``authenticate`` before its body was read)
CHECKED = "identity_checked"


def _load(rt: Any, cache: IdentityCache, key: str, secret: str) -> Identity:
    """The identity of ``secret`` read from the store (a thread: it blocks), then cached."""
    generation = cache.generation()  # before the read: a change during it is not cached
    read_at = cache.clock()
    if key.startswith("p:"):
        who = _of(rt, secret, users_mod.get_user(rt.store, secret))
        cache.put(key, who, generation, read_at=read_at)
        return who
    found = users_mod.token_user(rt.store, secret)
    if found is None:  # not cached: a token that becomes valid is never one (hashes are unique)
        raise ApiError(401, "unauthenticated", "invalid, expired or revoked token",
                       headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    user, expires_at = found
    who = _of(rt, user.name, user)
    cache.put(key, who, generation, expires_at, read_at)
    return who


def _load_many(rt: Any, cache: IdentityCache, secrets: dict[str, str]) -> None:
    """Read the identities of ``secrets`` (cache key -> token or proxied name) again, tokens in
    one transaction, and cache them; a token that no longer authenticates is dropped."""
    generation = cache.generation()  # before the read: a change during it is not cached
    read_at = cache.clock()
    toks = [s for k, s in secrets.items() if not k.startswith("p:")]
    found = users_mod.token_users(rt.store, toks) if toks else {}
    for key, secret in secrets.items():
        if key.startswith("p:"):
            who = _of(rt, secret, users_mod.get_user(rt.store, secret))
            cache.put(key, who, generation, read_at=read_at)
        elif secret in found:
            user, expires_at = found[secret]
            cache.put(key, _of(rt, user.name, user), generation, expires_at, read_at)
        else:
            cache.drop(key)


class IdentityRefresh:
    """Identities read ahead (``IdentityCache.due``): ``want`` notes a key, and one task at a
    time reads every key noted (``_load_many``) in a worker thread. A failed read is logged;
    its entries then expire as usual, and the request path reads them itself."""

    def __init__(self, rt: Any, cache: IdentityCache) -> None:
        self.rt, self.cache = rt, cache
        self._wanted: dict[str, str] = {}
        self._reading: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def want(self, key: str, secret: str) -> None:
        if key in self._reading or key in self._wanted:
            return
        self._wanted[key] = secret
        if self._task is None or self._task.done():  # (done: its loop ended under it)
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._wanted:
                batch, self._wanted = self._wanted, {}
                self._reading = set(batch)
                try:
                    await anyio.to_thread.run_sync(_load_many, self.rt, self.cache, batch)
                except Exception as e:  # the store unavailable: requests read it themselves
                    log.warning("could not read %d identities ahead: %s", len(batch), e)
                finally:
                    self._reading = set()
        finally:
            self._task = None


def cached(state: Any, key: str, secret: str) -> Identity | None:
    """The cached identity of ``key`` (None: not cached), read ahead when it is due."""
    who: Identity | None = state.identities.get(key)
    if who is not None and state.identities.due(key):
        state.identity_refresh.want(key, secret)
    return who


async def authenticate(state: Any, scope: Any) -> Identity:
    """The identity of the request ``scope`` (ApiError 401 without one), rate-limited (429);
    ``state``: the app's state. A cached identity (``IdentityCache``) is answered without a
    thread or a store read. Needs only the headers: a route may call it before the body is
    read (``limits.BodyLimit``)."""
    rt = state.rt
    key, secret = key_of(rt.cfg.server.auth, scope.get("client"), first_headers(scope["headers"]))
    who = cached(state, key, secret)
    if who is None:
        who = await anyio.to_thread.run_sync(_load, rt, state.identities, key, secret)
    req_state = scope.setdefault("state", {})
    req_state["identity"] = who
    if state.limiter is not None:
        state.limiter.check(who.name)
    req_state[CHECKED] = True
    return who


async def identity(request: Request) -> Identity:
    """The request's identity (401 without one), rate-limited per identity (429): the FastAPI
    dependency of every ``/api/v1`` route (once per request: ``authenticate`` may have run
    before the body was read)."""
    req_state = request.scope.get("state") or {}
    if req_state.get(CHECKED):
        who: Identity = req_state["identity"]
        return who
    return await authenticate(request.app.state, request.scope)


def require_admin(who: Identity) -> None:
    if not who.admin:
        raise ApiError(403, "forbidden", "this needs the admin role")
