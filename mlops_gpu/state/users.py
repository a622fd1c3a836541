"""Users, API tokens and project memberships of ``mlops-gpu server`` (tables of schema v9).

Invariants:
- A token is shown once, when made; the store keeps only its SHA-256 (``tokens.hash``), so a
  copy of the store does not give anyone's token away.
- A token authenticates only while it is not revoked, not expired, and its user exists.
- Each function is one transaction of the store it is given.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field

from sqlalchemy import delete, select, update

from mlops_gpu.state.schema import memberships, tokens, users
from mlops_gpu.state.store import Store

#: Tokens look like ``mgt_<43 url-safe characters>`` (32 random bytes).
TOKEN_PREFIX = "mgt_"
ROLES = ("viewer", "member", "maintainer")


class UserError(ValueError):
    """A user operation that cannot be done (unknown user, one that exists already)."""


@dataclass(frozen=True)
class User:
    name: str
    admin: bool
    created_at: float
    #: project -> role stored for this user (the config's members are not included)
    projects: dict[str, str] = field(default_factory=dict)
    #: tokens that still authenticate, and when the last of them expires
    active_tokens: int = 0
    expires_at: float | None = None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def add_user(
    store: Store,
    name: str,
    *,
    admin: bool,
    projects: dict[str, str],
    ttl_s: float,
    now: float | None = None,
) -> str:
    """Create user ``name`` with its roles and a first token; the token (shown once)."""
    now = time.time() if now is None else now
    token = new_token()
    with store._tx() as conn:
        if conn.execute(select(users.c.name).where(users.c.name == name)).first() is not None:
            raise UserError(f"user {name!r} exists already (`mlops-gpu users token {name}` "
                            "gives it a new token)")  # fmt: skip
        conn.execute(users.insert().values(name=name, admin=admin, created_at=now))
        for project, role in projects.items():
            conn.execute(memberships.insert().values(user=name, project=project, role=role))
        conn.execute(tokens.insert().values(hash=token_hash(token), user=name, created_at=now,
                                            expires_at=now + ttl_s))  # fmt: skip
    return token


def add_token(store: Store, name: str, *, ttl_s: float, now: float | None = None) -> str:
    """A new token for an existing user (its other tokens stay valid); the token."""
    now = time.time() if now is None else now
    token = new_token()
    with store._tx() as conn:
        if conn.execute(select(users.c.name).where(users.c.name == name)).first() is None:
            raise UserError(f"no user {name!r} (see `mlops-gpu users list`)")
        conn.execute(tokens.insert().values(hash=token_hash(token), user=name, created_at=now,
                                            expires_at=now + ttl_s))  # fmt: skip
    return token


def revoke(store: Store, name: str, now: float | None = None) -> int:
    """Revoke every token of ``name``; how many were still valid."""
    now = time.time() if now is None else now
    with store._tx() as conn:
        if conn.execute(select(users.c.name).where(users.c.name == name)).first() is None:
            raise UserError(f"no user {name!r} (see `mlops-gpu users list`)")
        res = conn.execute(
            update(tokens)
            .where(tokens.c.user == name, tokens.c.revoked_at.is_(None))
            .values(revoked_at=now)
        )
        return int(res.rowcount or 0)


def set_membership(store: Store, name: str, project: str, role: str | None) -> None:
    """Give ``name`` ``role`` in ``project`` (None: remove the stored role)."""
    if role is not None and role not in ROLES:
        raise UserError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    with store._tx() as conn:
        if conn.execute(select(users.c.name).where(users.c.name == name)).first() is None:
            raise UserError(f"no user {name!r} (see `mlops-gpu users list`)")
        conn.execute(
            delete(memberships).where(memberships.c.user == name, memberships.c.project == project)
        )
        if role is not None:
            conn.execute(memberships.insert().values(user=name, project=project, role=role))


def list_users(store: Store, now: float | None = None) -> list[User]:
    now = time.time() if now is None else now
    with store._ro() as conn:
        rows = conn.execute(select(users).order_by(users.c.name)).all()
        roles: dict[str, dict[str, str]] = {}
        for m in conn.execute(select(memberships).order_by(memberships.c.project)):
            roles.setdefault(m.user, {})[m.project] = m.role
        live: dict[str, list[float]] = {}
        q = select(tokens.c.user, tokens.c.expires_at).where(
            tokens.c.revoked_at.is_(None), tokens.c.expires_at > now
        )
        for t in conn.execute(q):
            live.setdefault(t.user, []).append(float(t.expires_at))
    return [
        User(
            r.name,
            bool(r.admin),
            float(r.created_at),
            roles.get(r.name, {}),
            len(live.get(r.name, [])),
            max(live[r.name]) if r.name in live else None,
        )
        for r in rows
    ]


def get_user(store: Store, name: str) -> User | None:
    """One user with its stored roles (``active_tokens`` not counted)."""
    with store._ro() as conn:
        row = conn.execute(select(users).where(users.c.name == name)).first()
        if row is None:
            return None
        roles = {
            m.project: m.role
            for m in conn.execute(select(memberships).where(memberships.c.user == name))
        }
    return User(row.name, bool(row.admin), float(row.created_at), roles)


def authenticate(store: Store, token: str, now: float | None = None) -> User | None:
    """The user a token belongs to, or None (unknown, malformed, revoked, expired)."""
    found = token_user(store, token, now)
    return None if found is None else found[0]


def token_user(store: Store, token: str, now: float | None = None) -> tuple[User, float] | None:
    """(the user a token belongs to, when the token expires), or None (unknown, malformed,
    revoked, expired, or its user gone). One read transaction."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    now = time.time() if now is None else now
    with store._ro() as conn:
        t = conn.execute(
            select(tokens.c.user, tokens.c.expires_at, tokens.c.revoked_at).where(
                tokens.c.hash == token_hash(token)
            )
        ).first()
        if t is None or t.revoked_at is not None or t.expires_at <= now:
            return None
        row = conn.execute(select(users).where(users.c.name == t.user)).first()
        if row is None:
            return None
        roles = {
            m.project: m.role
            for m in conn.execute(select(memberships).where(memberships.c.user == t.user))
        }
    return User(row.name, bool(row.admin), float(row.created_at), roles), float(t.expires_at)


def token_users(
    store: Store, tokens_: list[str], now: float | None = None
) -> dict[str, tuple[User, float]]:
    """``token_user`` of many tokens in one read transaction (three queries, whatever their
    number): token -> (its user, when it expires), for those that authenticate."""
    now = time.time() if now is None else now
    by_hash = {token_hash(t): t for t in tokens_ if t.startswith(TOKEN_PREFIX) and len(t) <= 200}
    if not by_hash:
        return {}
    with store._ro() as conn:
        found = [
            t
            for t in conn.execute(
                select(
                    tokens.c.hash, tokens.c.user, tokens.c.expires_at, tokens.c.revoked_at
                ).where(tokens.c.hash.in_(sorted(by_hash)))
            )
            if t.revoked_at is None and t.expires_at > now
        ]
        names = sorted({t.user for t in found})
        if not names:
            return {}
        rows = {r.name: r for r in conn.execute(select(users).where(users.c.name.in_(names)))}
        roles: dict[str, dict[str, str]] = {n: {} for n in names}
        for m in conn.execute(select(memberships).where(memberships.c.user.in_(names))):
            roles[m.user][m.project] = m.role
    out = {}
    for t in found:
        row = rows.get(t.user)
        if row is not None:
            user = User(row.name, bool(row.admin), float(row.created_at), roles[t.user])
            out[by_hash[t.hash]] = (user, float(t.expires_at))
    return out
