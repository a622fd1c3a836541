"""The audit trail of ``mlops-gpu server``: one row per mutating request (who, what, target,
when, from where, with what result). Append-only: nothing here updates or deletes a row."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select

from mlops_gpu.state.schema import audit
from mlops_gpu.state.store import Store

#: Longest stored text of each column (longer is cut: a hostile request cannot grow rows).
_WIDTH = {"user": 200, "action": 200, "target": 300, "client": 100, "detail": 2000}


@dataclass(frozen=True)
class AuditEntry:
    time: float
    user: str | None
    action: str
    target: str | None
    client: str | None
    status: int
    detail: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cut(key: str, value: str | None) -> str | None:
    if value is None:
        return None
    # stored as text: a lone surrogate (undecodable input) is replaced, never refused
    return value.encode("utf-8", "replace").decode("utf-8")[: _WIDTH[key]]


def entry_row(
    *,
    user: str | None,
    action: str,
    target: str | None,
    client: str | None,
    status: int,
    detail: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``audit`` row of one request (its texts cut to their widths)."""
    return {
        "time": time.time() if now is None else now,
        "user": _cut("user", user),
        "action": _cut("action", action),
        "target": _cut("target", target),
        "client": _cut("client", client),
        "status": status,
        "detail": _cut("detail", detail),
    }


def record(
    store: Store,
    *,
    user: str | None,
    action: str,
    target: str | None,
    client: str | None,
    status: int,
    detail: str | None = None,
    now: float | None = None,
) -> None:
    record_many(store, [entry_row(user=user, action=action, target=target, client=client,
                                  status=status, detail=detail, now=now)])  # fmt: skip


def record_many(store: Store, rows: Sequence[dict[str, Any]]) -> None:
    """Rows of ``entry_row`` in one transaction (the server's group commit of audit rows)."""
    if rows:
        with store._tx() as conn:
            conn.execute(audit.insert(), list(rows))


def read(
    store: Store, *, since: float | None = None, user: str | None = None, limit: int | None = None
) -> list[AuditEntry]:
    """Entries, oldest first (``limit``: the newest ``limit`` of them)."""
    q = select(audit)
    if since is not None:
        q = q.where(audit.c.time >= since)
    if user is not None:
        q = q.where(audit.c.user == user)
    q = q.order_by(audit.c.id.desc())
    if limit is not None:
        q = q.limit(limit)
    with store._ro() as conn:
        rows = conn.execute(q).all()
    return [
        AuditEntry(r.time, r.user, r.action, r.target, r.client, r.status, r.detail)
        for r in reversed(rows)
    ]
