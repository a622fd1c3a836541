"""The cluster as the identity may see it: the queue (reasons, ETAs), the history of finished
runs, nodes, projects (quota, usage, fair share), the config (admins) and the scheduler's
status. Reads only."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from mlops_gpu.model.public import run_to_public
from mlops_gpu.server.auth import Identity, identity, require_admin
from mlops_gpu.server.errors import ApiError

router = APIRouter(tags=["cluster"])
Who = Annotated[Identity, Depends(identity)]


@router.get("/whoami", summary="The caller's identity and roles")
def whoami(who: Who) -> dict[str, Any]:
    return {"name": who.name, "admin": who.admin, "roles": dict(who.roles)}


@router.get("/queue", summary="Pending runs in queue order, each with its reason and ETA")
def queue(
    request: Request,
    who: Who,
    project: Annotated[str | None, Query(max_length=200)] = None,
    user: Annotated[str | None, Query(max_length=200)] = None,
) -> list[dict[str, Any]]:
    from mlops_gpu.controller.views import queue_runs

    runs = queue_runs(request.app.state.rt, project, user)
    return [run_to_public(r) for r in runs if who.can_see(r.project)]


@router.get("/history", summary="Finished runs, newest end first (as `history --json`)")
def history(
    request: Request,
    who: Who,
    since: datetime | None = None,
    project: Annotated[str | None, Query(max_length=200)] = None,
    user: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> list[dict[str, Any]]:
    """Runs of the projects the identity sees that ended at or after ``since`` (default: a
    day ago; UTC unless it says)."""
    import time

    from mlops_gpu.controller.history import DEFAULT_SINCE_S, history_rows

    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=timezone.utc)
    start = since.timestamp() if since is not None else time.time() - DEFAULT_SINCE_S
    visible = who.visible_projects()
    projects: set[str] | None = visible
    if project is not None:
        projects = {project} if visible is None or project in visible else set()
    return history_rows(request.app.state.rt, since=start, projects=projects, user=user,
                        limit=limit)  # fmt: skip


@router.get("/nodes", summary="Nodes with their free GPUs (runs listed only where visible)")
def nodes(request: Request, who: Who) -> list[dict[str, Any]]:
    """``nodes --json`` plus ``state_reason`` (why a node is unschedulable, for tables)."""
    from mlops_gpu.controller.views import node_rows

    return node_rows(request.app.state.rt, who.visible_projects(), with_state_reason=True)


@router.get("/projects", summary="Projects with quotas, usage and fair share")
def projects(request: Request, who: Who) -> list[dict[str, Any]]:
    from mlops_gpu.controller.views import project_rows

    out = project_rows(request.app.state.rt, who.visible_projects())
    for row in out:
        row["role"] = "admin" if who.admin else who.role(row["name"])
    return out


@router.get("/projects/{project}", summary="One project with quota, usage and fair share")
def project(project: str, request: Request, who: Who) -> dict[str, Any]:
    from mlops_gpu.controller.views import project_rows

    rows = project_rows(request.app.state.rt, {project}) if who.can_see(project) else []
    if not rows:
        raise ApiError(404, "not_found", f"no project {project!r}", "project")
    rows[0]["role"] = "admin" if who.admin else who.role(project)
    return rows[0]


_top_lock = threading.Lock()


@router.get("/top", summary="One `mlops-gpu top` frame: GPUs, the queue's head, projects")
def top(
    request: Request,
    who: Who,
    queue: Annotated[int, Query(ge=0, le=1000)] = 10,
    nodes: Annotated[int, Query(ge=1, le=100_000)] = 32,
) -> dict[str, Any]:
    """``controller.top_data``: every GPU's state and utilization (of the first ``nodes``
    nodes), the queue's head and project rows of the projects the identity sees (runs of
    other projects are not named). One reader per app, kept between calls (it reads only what
    changed), one call at a time."""
    from mlops_gpu.controller.cluster_view import ClusterReader
    from mlops_gpu.controller.top_data import frame_data

    state = request.app.state
    with _top_lock:
        reader = getattr(state, "top_reader", None)
        if reader is None:
            reader = state.top_reader = ClusterReader(state.rt)
        return frame_data(state.rt, reader, queue_rows=queue, max_nodes=nodes,
                          projects=who.visible_projects())  # fmt: skip


@router.get("/report", summary="GPU-hours, cost, waits, preemptions (as `report --format json`)")
def report(
    request: Request,
    who: Who,
    by: Literal["project", "user", "gpu_type", "day"] = "project",
    since: datetime | None = None,
) -> dict[str, Any]:
    """From the usage ledger, counting only attempts of projects the identity sees."""
    from mlops_gpu.controller.usage_report import build_report

    rt = request.app.state.rt
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=timezone.utc)
    start = since.timestamp() if since is not None else None
    rows = [r for r in rt.store.usage(since=start) if who.can_see(r.project)]
    prices = {t: g.price_per_hour for t, g in rt.cfg.model_gpu_types().items()}
    return build_report(rows, prices, start, by)


@router.get("/config", summary="The config the server runs (admins; the store's password hidden)")
def config(request: Request, who: Who) -> dict[str, Any]:
    from mlops_gpu.controller.views import store_display

    require_admin(who)
    rt = request.app.state.rt
    out: dict[str, Any] = rt.cfg.model_dump(mode="json")
    out["store"] = store_display(rt)
    out["source"] = str(rt.cfg.source) if rt.cfg.source else None
    return out


@router.get("/scheduler", summary="The scheduler that runs for this store")
def scheduler(request: Request, who: Who) -> dict[str, Any]:
    from mlops_gpu.controller.views import scheduler_status

    out = scheduler_status(request.app.state.rt)
    thread = request.app.state.scheduler
    out["this_server"] = thread.role if thread is not None else "off"
    return out
