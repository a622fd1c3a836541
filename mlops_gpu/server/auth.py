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

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import Request

from mlops_gpu.config.server import ROLE_RANK
from mlops_gpu.model import Run
from mlops_gpu.server.errors import ApiError


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


def proxy_identity(request: Request) -> Identity | None:
    """In ``auth.mode: proxy``, the identity the trusted proxy names; else None."""
    from mlops_gpu.state import users

    rt = request.app.state.rt
    auth = rt.cfg.server.auth
    client = request.client.host if request.client else None
    if auth.mode == "proxy" and _trusted(client, auth.trusted_proxies):
        name = request.headers.get(auth.proxy_header, "").strip()
        if name and len(name) <= 200:
            user = users.get_user(rt.store, name)
            stored = user.projects if user else {}
            return Identity(name, bool(user and user.admin),
                            _merged_roles(_members(rt), stored, name))  # fmt: skip
    return None


def token_identity(rt: Any, token: str) -> Identity | None:
    """The identity a bearer token belongs to (None: unknown, expired or revoked)."""
    from mlops_gpu.state import users

    user = users.authenticate(rt.store, token.strip())
    if user is None:
        return None
    return Identity(user.name, user.admin, _merged_roles(_members(rt), user.projects, user.name))


def _resolve(request: Request) -> Identity:
    who = proxy_identity(request)
    if who is not None:
        return who
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "unauthenticated", "no credentials: send Authorization: Bearer TOKEN",
                       headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthenticated", "malformed Authorization header: expected "
                       "Bearer TOKEN", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    who = token_identity(request.app.state.rt, token)
    if who is None:
        raise ApiError(401, "unauthenticated", "invalid, expired or revoked token",
                       headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    return who


async def identity(request: Request) -> Identity:
    """The request's identity (401 without one), rate-limited per identity (429)."""
    who = await anyio.to_thread.run_sync(_resolve, request)
    request.state.identity = who
    limiter = request.app.state.limiter
    if limiter is not None:
        limiter.check(who.name)
    return who


def require_admin(who: Identity) -> None:
    if not who.admin:
        raise ApiError(403, "forbidden", "this needs the admin role")
