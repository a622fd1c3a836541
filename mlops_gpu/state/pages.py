"""Runs read page by page (the server's ``GET /api/v1/runs``): newest first, by ``seq``.

A page's cursor is the ``seq`` of its last run; the next page holds the runs with a smaller
``seq``, so a run submitted meanwhile never shifts a page, and every run that existed when the
first page was read is listed exactly once. Reads only.

``page_public`` is the same page as ``page_runs``, in the public JSON shape
(``model.public.run_to_public``), built straight from the rows: the server's ``GET /runs``
writes 500 runs a page, and building a ``Run`` (its whole ``RunSpec``) for each was most of the
page's CPU; nor does it fill the store's run cache (a listing of 50,000 runs grew the heap, and
with it the garbage collector's full passes: the page p99). Invariant: ``page_public(...)[0]``
equals ``[run_to_public(r) for r in page_runs(...)[0]]`` (tests/team/test_pages_public.py).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import Row, Select, select

from mlops_gpu.model import Phase, Placement, Run
from mlops_gpu.model.public import iso
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
    q = _query(projects, user, phases, since, before_seq, limit, array_id)
    with store._ro() as conn:
        rows = conn.execute(q).all()
    out = [store._run(r) for r in rows[:limit]]
    return out, (out[-1].seq if len(rows) > limit and out else None)


def page_public(
    store: Store,
    *,
    projects: Collection[str] | None = None,
    user: str | None = None,
    phases: Iterable[Phase] | None = None,
    since: float | None = None,
    before_seq: int | None = None,
    limit: int = 100,
    array_id: str | None = None,
) -> tuple[list[dict[str, Any]], int | None]:
    """``page_runs``' page, each run as ``run_to_public`` has it."""
    q = _query(projects, user, phases, since, before_seq, limit, array_id)
    with store._ro() as conn:
        rows = conn.execute(q).all()
    out = [_public(r) for r in rows[:limit]]
    return out, (rows[limit - 1].seq if len(rows) > limit and out else None)


def _query(
    projects: Collection[str] | None,
    user: str | None,
    phases: Iterable[Phase] | None,
    since: float | None,
    before_seq: int | None,
    limit: int,
    array_id: str | None = None,
) -> Select[Any]:
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
    return q.order_by(runs.c.seq.desc()).limit(limit + 1)


def _public(row: Row[Any]) -> dict[str, Any]:
    """``run_to_public`` of the run in ``row``, reading of its spec only what that shows, with
    ``RunSpec.from_dict``'s defaults (keep the two in step: the test compares them)."""
    spec = json.loads(row.spec)
    req = spec.get("request", {})
    types = req.get("gpu_types", ())
    arr = spec.get("array") or {}
    p = Placement.from_dict(json.loads(row.placement)) if row.placement else None
    return {
        "id": row.id,
        "name": spec["name"],
        "project": spec["project"],
        "user": spec["user"],
        "priority": spec.get("priority", "normal"),
        "phase": Phase(row.phase).value,
        "gpus": int(req.get("gpus", 1)),
        "num_nodes": int(req.get("nodes", 1)),
        "gpu_fraction": req.get("gpu_fraction"),
        "mig": req.get("mig"),
        "gpu_type": p.gpu_type if p else (types[0] if len(types) == 1 else None),
        "backend": p.backend if p else spec.get("backend"),
        "node_names": list(p.node_names) if p else [],
        "devices": [d for s in p.slots for d in s.devices] if p else [],
        "attempt": row.attempt,
        "submitted_at": iso(row.submitted_at),
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "reason_code": row.reason_code,
        "reason": row.reason,
        "eta": iso(row.eta),
        "array_id": arr.get("id"),
        "array_index": arr.get("index"),
    }
