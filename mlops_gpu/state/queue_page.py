"""The pending queue read a page at a time (the web dashboard's Queue page): counts by class
and reason code, and one slice of the queue in its order (highest class first, then oldest).

Invariants: reads only; a page reads at most ``limit`` rows per class it touches (never the
whole queue: 50,000 pending runs are counted, not loaded); the order is the one ``queue``
shows (``controller.views.queue_runs``): class value descending, then submit time, then seq.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import Select, func, select

from mlops_gpu.model import Phase
from mlops_gpu.state.schema import runs
from mlops_gpu.state.store import Store

#: The columns of a row of the page.
COLUMNS = (
    runs.c.id,
    runs.c.name,
    runs.c.project,
    runs.c.user,
    runs.c.priority,
    runs.c.reason_code,
    runs.c.reason,
    runs.c.eta,
    runs.c.submitted_at,
    runs.c.attempt,
    runs.c.spec,
)


def _filtered(
    q: Select[Any],
    projects: Collection[str] | None,
    user: str | None,
    reason_code: str | None,
) -> Select[Any]:
    q = q.where(runs.c.phase == Phase.PENDING.value)
    if projects is not None:
        q = q.where(runs.c.project.in_(sorted(projects)))
    if user is not None:
        q = q.where(runs.c.user == user)
    if reason_code == "":  # a run the scheduler has not explained yet
        q = q.where(runs.c.reason_code.is_(None))
    elif reason_code is not None:
        q = q.where(runs.c.reason_code == reason_code)
    return q


def pending_counts(
    store: Store,
    projects: Collection[str] | None = None,
    user: str | None = None,
) -> dict[tuple[str, str | None], int]:
    """(class, reason code or None) -> pending runs, of ``projects`` (None: all) and ``user``."""
    q = _filtered(
        select(runs.c.priority, runs.c.reason_code, func.count()), projects, user, None
    ).group_by(runs.c.priority, runs.c.reason_code)
    with store._ro() as conn:
        return {(str(p), c): int(n) for p, c, n in conn.execute(q)}


def pending_slice(
    store: Store,
    per_class: Mapping[str, int],
    order: Mapping[str, int],
    *,
    offset: int,
    limit: int,
    projects: Collection[str] | None = None,
    user: str | None = None,
    reason_code: str | None = None,
) -> list[Any]:
    """Rows ``offset`` .. ``offset + limit`` of the filtered queue in queue order.
    ``per_class``: pending runs per class under the same filters (from ``pending_counts``), so
    that classes wholly before ``offset`` are skipped without reading them; ``order``: class ->
    its value (the config's ``priority_classes``); ``reason_code``: only runs with this code
    ("": runs without one yet)."""
    out: list[Any] = []
    skip = offset
    with store._ro() as conn:
        for cls in sorted(per_class, key=lambda c: (-order.get(c, 0), c)):
            n = per_class[cls]
            if skip >= n:
                skip -= n
                continue
            q = (
                _filtered(select(*COLUMNS), projects, user, reason_code)
                .where(runs.c.priority == cls)
                .order_by(runs.c.submitted_at, runs.c.seq)
                .offset(skip)
                .limit(limit - len(out))
            )
            out.extend(conn.execute(q).all())
            skip = 0
            if len(out) >= limit:
                break
    return out
