"""The data of one ``mlops-gpu top`` frame, as plain JSON-able values: what ``top --once
--json`` prints, what the server's ``/api/v1/top`` answers, and what ``cli.top`` draws (the
same drawing locally and against a server).

Keys: ``now``; ``scheduler`` (a line); ``counts`` (GPUs allocated, free, cordoned: the whole
cluster); ``nodes_total``; ``gpus`` (one entry per GPU: node, gpu_type, gpu, state, run,
utilization_pct; for the first ``max_nodes`` nodes in inventory order, or all); ``holding``
(runs holding GPUs); ``pending`` (runs pending); ``queue`` (the head of the queue: id, name,
project, priority, reason_code, reason, eta); ``projects`` (usage against quota, one row per
project).

Invariants:
- Built from one ``ClusterView`` and the queue's head (``observed.pending_head``): never the
  whole queue.
- ``projects`` (a set) limits what is shown to an identity that may see only those projects:
  runs (queue, holders of GPUs) and project rows of other projects are left out, and the
  counts of runs are of its projects; the GPUs themselves (node, state, utilization) are the
  cluster's, as ``/nodes`` shows them to everyone.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from mlops_gpu.controller.cluster_view import ClusterReader, ClusterView

PROJECT_KEYS = ("project", "quota", "borrowed", "running", "pending", "fair_share", "budget")


def scheduler_line(rt: Any) -> str:
    from mlops_gpu.state import heartbeat as hb

    info = hb.read(rt.store)
    if not hb.is_running(info):
        return "not running"
    assert info is not None
    return f"running (pid {info.pid} on {info.host})"


def _project_rows(view: ClusterView, shown: Any) -> list[list[object]]:
    pending, running = view.pending_by_project(), view.running_by_project()
    names = sorted(set(view.projects) | set(pending) | set(running))
    types = sorted({t for (_p, t) in view.used} | set(view.gpu_types))
    rows: list[list[object]] = []
    for p in names:
        if not shown(p):
            continue
        proj = view.projects.get(p)
        quota = []
        borrowed = 0.0
        for t in types:
            u = view.used.get((p, t), 0.0)
            nom = proj.quota(t).nominal if proj is not None else 0
            if u or nom:
                quota.append(f"{u:g}/{nom} {t}")
            borrowed += max(u - nom, 0.0)
        budget = view.budget_ratio.get(p)
        rows.append([p, ", ".join(quota) or "-", f"{borrowed:g}", running.get(p, 0),
                     pending.get(p, 0), f"{view.fair_share.get(p, 0.0):.3f}",
                     "-" if budget is None else f"{100 * budget:.0f}%"])  # fmt: skip
    return rows


def frame_data(
    rt: Any,
    reader: ClusterReader,
    *,
    queue_rows: int,
    max_nodes: int | None = None,
    projects: Collection[str] | None = None,
) -> dict[str, Any]:
    """One frame's data (module docstring); ``projects``: None for everything (an admin or
    local mode)."""
    from mlops_gpu.state import observed

    def shown(p: str) -> bool:
        return projects is None or p in projects

    view = reader.view()
    owner = {r.id: r.project for r in view.obs.active}
    util = {(s.node, s.device): s.utilization_pct for s in view.obs.samples}
    counts = {"allocated": 0, "free": 0, "cordoned": 0}
    gpus: list[dict[str, Any]] = []
    for i, n in enumerate(view.nodes):
        for d in view.node_devices(n):
            state = view.gpu_state(n, d)
            counts[state] += 1
            if max_nodes is not None and i >= max_nodes:
                continue
            run = view.holder.get((n.name, d))
            gpus.append({"node": n.name, "gpu_type": n.gpu_type, "gpu": d, "state": state,
                         "run": run if run is not None and shown(owner.get(run, "")) else None,
                         "utilization_pct": util.get((n.name, d))})  # fmt: skip
    head = observed.pending_head(rt.store, queue_rows, view.priority_classes, projects)
    pending = sum(n for (p, _c, _r), n in view.obs.pending.items() if shown(p))
    holding = sum(n for p, n in view.running_by_project().items() if shown(p))
    return {
        "now": view.now,
        "scheduler": scheduler_line(rt),
        "counts": counts,
        "nodes_total": len(view.nodes),
        "gpus": gpus,
        "holding": holding,
        "pending": pending,
        "queue": [
            {
                "id": r.id,
                "name": r.name,
                "project": r.project,
                "priority": r.priority,
                "reason_code": r.reason_code,
                "reason": r.reason,
                "eta": r.eta,
            }
            for r in head
        ],
        "projects": [
            dict(zip(PROJECT_KEYS, row, strict=True)) for row in _project_rows(view, shown)
        ],
    }
