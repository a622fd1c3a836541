"""The Queue page: pending runs the identity may see, with their reason and ETA, filtered by
project, user and reason code; counts by reason code over the whole filtered queue, then one
page of ``PAGE`` runs in queue order (a queue of 50,000 is counted, never loaded)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlops_gpu.server.auth import Identity
from mlops_gpu.server.dashboard import fmt

PAGE = 50
UNEXPLAINED = "unknown"  # a pending run the scheduler has not explained yet (as the metrics)


@dataclass
class QueuePage:
    rows: list[dict[str, Any]]
    by_reason: list[tuple[str, int]]
    total: int
    page: int
    pages: int
    projects: list[str]
    filters: dict[str, str] = field(default_factory=dict)


def build(
    rt: Any,
    who: Identity,
    *,
    project: str | None,
    user: str | None,
    reason: str | None,
    page: int,
    now: float,
) -> QueuePage:
    from mlops_gpu.state.queue_page import pending_counts, pending_slice

    visible = who.visible_projects()
    projects: set[str] | None = visible
    if project:
        projects = {project} if visible is None or project in visible else set()
    names = sorted(rt.cfg.projects if visible is None else visible)
    filters = {"project": project or "", "user": user or "", "reason": reason or ""}
    if projects is not None and not projects:
        return QueuePage([], [], 0, 1, 1, names, filters)
    counts = pending_counts(rt.store, projects, user or None)
    by_reason: dict[str, int] = {}
    per_class: dict[str, int] = {}
    code = None if not reason else ("" if reason == UNEXPLAINED else reason)
    for (cls, c), n in counts.items():
        by_reason[c or UNEXPLAINED] = by_reason.get(c or UNEXPLAINED, 0) + n
        if not reason or (c or UNEXPLAINED) == reason:
            per_class[cls] = per_class.get(cls, 0) + n
    total = sum(per_class.values())
    pages = max(1, -(-total // PAGE))
    page = min(max(page, 1), pages)
    found = pending_slice(
        rt.store,
        per_class,
        rt.cfg.priority_classes,
        offset=(page - 1) * PAGE,
        limit=PAGE,
        projects=projects,
        user=user or None,
        reason_code=code,
    ) if total else []  # fmt: skip
    rows = [
        {
            "id": r.id,
            "name": r.name or "",
            "project": r.project,
            "user": r.user,
            "priority": r.priority,
            "request": fmt.spec_request(r.spec),
            "attempt": r.attempt,
            "reason_code": r.reason_code or UNEXPLAINED,
            "reason": r.reason or "not yet explained by the scheduler",
            "eta": fmt.utc(r.eta) if r.eta is not None else "",
            "eta_in": fmt.relative(r.eta, now) if r.eta is not None else "unknown",
            "waiting": fmt.span(now - r.submitted_at),
            "can_cancel": who.can_cancel_of(r.project, r.user),
        }
        for r in found
    ]
    order = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return QueuePage(rows, order, total, page, pages, names, filters)
