"""Read views every edge shows the same way (the CLI's ``queue``, ``nodes``, ``cancel``,
``scheduler status``; the server's endpoints): computed here once, rendered by each edge.

Reads only, except ``cancel`` (the store's ``request_cancel``)."""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.model import ACTIVE_PHASES, Phase, Run
from mlops_gpu.state import Store


def queue_runs(rt: Runtime, project: str | None = None, user: str | None = None) -> list[Run]:
    """Pending runs, highest class first, then oldest first (the order ``queue`` shows);
    ``user``: only that user's."""
    prio = rt.cfg.priority_classes
    return sorted(
        (
            r
            for r in rt.store.list_runs([Phase.PENDING], project=project)
            if user is None or r.spec.user == user
        ),
        key=lambda r: (-prio.get(r.spec.priority, 0), r.submitted_at, r.seq),
    )


def user_runs(store: Store, project: str | None, user: str | None, limit: int | None) -> list[Run]:
    """Runs newest first (``status``): of ``project`` and ``user`` where given; ``limit``:
    at most that many (None: all)."""
    if user is None:
        return store.list_runs(project=project, newest_first=True, limit=limit)
    from mlops_gpu.state.pages import page_runs

    projects = [project] if project is not None else None
    big = 1 << 62  # (no limit: every run of the user)
    return page_runs(store, projects=projects, user=user, limit=limit or big)[0]


def cancel_run(rt: Runtime, run_id: str) -> tuple[Phase, str]:
    """Cancel a run (pending: at once; active: by its checkpoint signal); (the phase after
    the call, what happened in words)."""
    phase = rt.store.request_cancel(run_id)
    if phase is Phase.CANCELLED:
        return phase, "cancelled"
    if phase in (Phase.SUCCEEDED, Phase.FAILED):
        return phase, f"already {phase.value}"
    return phase, "stopping (checkpoint signal, then SIGKILL after the grace)"


def node_rows(
    rt: Runtime, visible: Collection[str] | None = None, with_state_reason: bool = False
) -> list[dict[str, Any]]:
    """Every node of every backend with its free GPUs and the runs on it (``nodes --json``);
    ``visible``: list only runs of these projects (None: all); ``with_state_reason``: add why
    an unschedulable node is (the table shows it)."""
    from mlops_gpu.controller.snapshot import build_snapshot
    from mlops_gpu.core.capacity import Capacity

    active = rt.store.list_runs(ACTIVE_PHASES)
    snap = build_snapshot(rt, [], active, 0.0, with_usage=False)
    cap = Capacity(snap)
    holders: dict[str, list[str]] = {}
    for r in active:
        if visible is not None and r.project not in visible:
            continue
        for node in r.placement.node_names if r.placement else ():
            holders.setdefault(node, []).append(r.id)
    return [
        {
            "name": n.name,
            "backend": n.backend,
            "gpu_type": n.gpu_type,
            "gpus": n.capacity,
            "free_gpus": len(cap.free[n.name]),
            "free_devices": cap.free[n.name],
            "schedulable": n.schedulable,
            "labels": dict(n.labels),
            "runs": holders.get(n.name, []),
            **({"state_reason": n.state_reason} if with_state_reason else {}),
        }
        for n in snap.nodes
    ]


def project_rows(rt: Runtime, names: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Projects (``names``, or all) with their quotas, what their runs hold now per GPU type,
    their pending and active run counts and their fair share (the weighted dominant share of
    decayed usage that orders projects; lower goes first)."""
    from mlops_gpu.controller.snapshot import build_snapshot
    from mlops_gpu.core.capacity import Capacity
    from mlops_gpu.core.fairshare import Shares

    active = rt.store.list_runs(ACTIVE_PHASES)
    pending = rt.store.list_runs([Phase.PENDING])
    snap = build_snapshot(rt, [], active, time.time())
    cap = Capacity(snap)
    shares = Shares(snap, cap.used, cap.capacity_by_type)
    out = []
    for name, p in rt.cfg.projects.items():
        if names is not None and name not in names:
            continue
        out.append(
            {
                "name": name,
                "cohort": p.cohort,
                "weight": p.weight,
                "quotas": {
                    t: {
                        "nominal": q.nominal,
                        "borrowing_limit": q.borrowing_limit,
                        "lending_limit": q.lending_limit,
                    }
                    for t, q in p.quotas.items()
                },
                "usage": {t: round(v, 3) for (pr, t), v in cap.used.items() if pr == name and v},
                "pending": sum(1 for r in pending if r.project == name),
                "active": sum(1 for r in active if r.project == name),
                "fair_share": round(shares.share(name), 6),
            }
        )
    return out


def log_files(rt: Runtime, run: Run, attempt: int) -> list[Path]:
    """The log files of a run's attempt, from whichever backend keeps them."""
    out: list[Path] = []
    for backend in rt.backends.values():
        out += backend.log_files(run.id, attempt)
    return out


def store_display(rt: Runtime) -> str:
    """The store URL without its password."""
    from sqlalchemy.engine import make_url

    try:
        return str(make_url(rt.cfg.store_url).render_as_string(hide_password=True))
    except Exception:
        return str(rt.cfg.store_url)


def scheduler_status(rt: Runtime) -> dict[str, Any]:
    """``scheduler status --json``: the published row, whether it is running, and whether the
    config file changed since the scheduler loaded it."""
    from mlops_gpu.controller.config_watch import file_version
    from mlops_gpu.state import heartbeat as hb

    info = hb.read(rt.store)
    now = time.time()
    out: dict[str, Any] = {"running": hb.is_running(info, now), "store": store_display(rt)}
    if info is None:
        return out
    running = out["running"]
    disk = file_version(Path(info.config_path)) if info.config_path else None
    out.update(
        pid=info.pid,
        host=info.host,
        version=info.version,
        started_at=info.started_at,
        uptime_s=round(now - info.started_at, 1) if running else None,
        stopped_at=info.stopped_at,
        last_tick_at=info.tick_at,
        last_tick_age_s=round(now - info.tick_at, 1) if info.tick_at else None,
        ticks=info.ticks,
        engine=info.engine,
        idle_exit_s=info.idle_exit_s,
        config={
            "path": info.config_path,
            "sha256": info.config_hash,
            "mtime": info.config_mtime,
            "loaded_at": info.config_loaded_at,
            "error": info.config_error,
            "restart_needed": info.config_restart.split(", ") if info.config_restart else [],
            "file_sha256": disk.sha256 if disk else None,
            "file_changed": disk is not None and disk.sha256 != info.config_hash,
        },
    )
    return out
