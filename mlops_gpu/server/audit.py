"""The audit middleware: one ``audit`` row (``state.audit``) for every mutating request under
``/api/`` (POST, PUT, PATCH, DELETE), whatever its result: who (the identity, or null when none
was established), what (method and route path), target (what the route named: run ids, a
project, a user; else the path), when, the client's address, and the HTTP status.

Routes name their target and a short detail in ``request.state.audit_target`` and
``request.state.audit_detail``. A row that cannot be written is logged, and the request's own
answer stands. The row is written (``group_commit``: with the rows of concurrent requests, in
one transaction) before the request's cycle ends, after its answer was sent. A single-run
submit answered by ``fast_submit`` does not pass through here: its row (``request_row``) is
stored in the transaction of the run itself, or written by ``fast_submit`` through the same
writer when it answers an error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlops_gpu.server.group_commit import GroupCommit

log = logging.getLogger("mlops_gpu.server")
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class AuditTrail:
    """``writer``: the app's ``GroupCommit`` of audit rows (``audit_writer``): rows of
    concurrent requests are written in one transaction."""

    def __init__(self, app: ASGIApp, writer: GroupCommit[dict[str, Any], None]) -> None:
        self.app, self.writer = app, writer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in MUTATING
            or not str(scope["path"]).startswith("/api/")
        ):
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        status = {"code": 500}

        async def seen(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                status["code"] = int(msg["status"])
            await send(msg)

        try:
            await self.app(scope, receive, seen)
        finally:
            await self._write(scope, state, status["code"])

    async def _write(self, scope: Scope, state: dict[str, Any], status: int) -> None:
        await write_row(self.writer, scope, request_row(scope, state, status))


def request_row(scope: Scope, state: dict[str, Any], status: int) -> dict[str, Any]:
    """The audit row of a request (``scope``, its ``state``) answered ``status``."""
    from mlops_gpu.state import audit

    who = state.get("identity")
    client = scope.get("client")
    return audit.entry_row(
        user=who.name if who is not None else None,
        action=f"{scope['method']} {scope['path']}",
        target=state.get("audit_target"),
        client=client[0] if client else None,
        status=status,
        detail=state.get("audit_detail"),
    )


async def write_row(writer: GroupCommit[dict[str, Any], None], scope: Scope,
                    row: dict[str, Any]) -> None:  # fmt: skip
    """``row`` written by ``writer``; a failure is logged (the request's answer stands)."""
    try:
        await writer.put(row)
    except Exception:
        log.exception("could not write the audit row of %s %s", scope["method"], scope["path"])


def audit_writer(store: Any) -> GroupCommit[dict[str, Any], None]:
    """The group commit of audit rows into ``store``."""
    from mlops_gpu.state import audit

    def write(rows: Sequence[dict[str, Any]]) -> list[None]:
        audit.record_many(store, rows)
        return [None] * len(rows)

    return GroupCommit(write, name="mlops-gpu-audit")
