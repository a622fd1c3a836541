"""The Runs page: runs the identity may see, newest first, a page of ``PAGE`` at a time (the
API's cursor paging: ``state.pages``), with phase, attempts, the work preemptions threw away
and a link to the MLflow run where the tracking server has a web UI (an http(s) URI)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from mlops_gpu.model import TERMINAL_PHASES, Phase
from mlops_gpu.server.auth import Identity
from mlops_gpu.server.dashboard import fmt

PAGE = 50


@dataclass
class RunsPage:
    rows: list[dict[str, Any]]
    next_cursor: str | None
    projects: list[str]
    phases: list[str]
    filters: dict[str, str] = field(default_factory=dict)


def mlflow_ui(rt: Any) -> str | None:
    """The MLflow web UI's base URL, where the tracking URI is a server's; else None."""
    uri = rt.cfg.tracking_uri(dict(os.environ))
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None


def build(
    rt: Any,
    who: Identity,
    *,
    project: str | None,
    user: str | None,
    phase: str | None,
    cursor: int | None,
    now: float,
) -> RunsPage:
    from mlops_gpu.state.dashboard_reads import run_notes
    from mlops_gpu.state.pages import page_runs

    visible = who.visible_projects()
    projects: set[str] | None = visible
    if project:
        projects = {project} if visible is None or project in visible else set()
    names = sorted(rt.cfg.projects if visible is None else visible)
    phases = [p.value for p in Phase]
    filters = {"project": project or "", "user": user or "", "phase": phase or "",
               "cursor": str(cursor) if cursor else ""}  # fmt: skip
    if projects is not None and not projects:
        return RunsPage([], None, names, phases, filters)
    runs, nxt = page_runs(rt.store, projects=projects, user=user or None,
                          phases=[Phase(phase)] if phase else None, before_seq=cursor,
                          limit=PAGE)  # fmt: skip
    notes = run_notes(rt.store, [r.id for r in runs])
    ui = mlflow_ui(rt)
    rows = []
    for r in runs:
        note = notes.get(r.id)
        mlflow_id = note.mlflow_run_id if note else None
        rows.append(
            {
                "id": r.id,
                "name": r.spec.name or "",
                "project": r.project,
                "user": r.spec.user,
                "phase": r.phase.value,
                "attempt": r.attempt,
                "max_attempts": r.spec.max_attempts,
                "request": fmt.request_text(r.spec.to_dict()["request"]),
                "where": ", ".join(r.placement.node_names) if r.placement else "",
                "submitted": fmt.utc(r.submitted_at),
                "ran": fmt.span((r.finished_at or now) - r.started_at) if r.started_at else "",
                "lost_gpu_h": fmt.num(note.lost_gpu_s / 3600, 2)
                if note and note.preemptions
                else "",
                "preemptions": note.preemptions if note else 0,
                "reason": r.reason or "",
                "mlflow_run_id": mlflow_id,
                "mlflow_url": f"{ui}/#/runs/{mlflow_id}" if ui and mlflow_id else None,
                "can_cancel": r.phase not in TERMINAL_PHASES and who.can_cancel(r),
            }
        )
    return RunsPage(rows, str(nxt) if nxt is not None else None, names, phases, filters)
