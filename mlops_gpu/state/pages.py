"""Runs read page by page (the server's ``GET /api/v1/runs``): newest first, by ``seq``.

A page's cursor is the ``seq`` of its last run; the next page holds the runs with a smaller
``seq``, so a run submitted meanwhile never shifts a page, and every run that existed when the
first page was read is listed exactly once. Reads only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sqlalchemy import select

from mlops_gpu.model import Phase, Run
from mlops_gpu.state.schema import runs
from mlops_gpu.state.store import Store


def page_runs(
    store: Store,
    *,
    projects: Collection[str] | None = None,
    user: str | None = None,
    phases: Iterable[Phase] | None = None,
    since: float | None = None,
    before_seq: int | None = None,
    limit: int = 100,
    array_id: str | None = None,
) -> tuple[list[Run], int | None]:
    """(up to ``limit`` runs newest first, the cursor of the next page or None).

    ``projects``: only runs of these projects (None: every project); ``since``: submitted at
    or after this time; ``array_id``: only that array's elements."""
    q = select(runs)
    if projects is not None:
        q = q.where(runs.c.project.in_(list(projects)))
    if user is not None:
        q = q.where(runs.c.user == user)
    if array_id is not None:
        q = q.where(runs.c.array_id == array_id)
    if phases is not None:
        q = q.where(runs.c.phase.in_([p.value for p in phases]))
    if since is not None:
        q = q.where(runs.c.submitted_at >= since)
    if before_seq is not None:
        q = q.where(runs.c.seq < before_seq)
    q = q.order_by(runs.c.seq.desc()).limit(limit + 1)
    with store._ro() as conn:
        rows = conn.execute(q).all()
    out = [store._run(r) for r in rows[:limit]]
    return out, (out[-1].seq if len(rows) > limit and out else None)
