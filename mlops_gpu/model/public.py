"""The public JSON shape of a run (DESIGN.md, "Public surfaces"): a stable contract.

Keys never change meaning; times are ISO 8601 UTC strings; unknown or not applicable is null.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from mlops_gpu.model.run import Run

RUN_KEYS = (
    "id",
    "name",
    "project",
    "user",
    "priority",
    "phase",
    "gpus",
    "num_nodes",
    "gpu_fraction",
    "mig",
    "gpu_type",
    "backend",
    "node_names",
    "devices",
    "attempt",
    "submitted_at",
    "started_at",
    "finished_at",
    "reason_code",
    "reason",
    "eta",
    "array_id",
    "array_index",
)


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def run_to_public(run: Run) -> dict[str, Any]:
    spec, req, p = run.spec, run.spec.request, run.placement
    requested_type = req.gpu_types[0] if len(req.gpu_types) == 1 else None
    return {
        "id": run.id,
        "name": spec.name,
        "project": spec.project,
        "user": spec.user,
        "priority": spec.priority,
        "phase": run.phase.value,
        "gpus": req.gpus,
        "num_nodes": req.nodes,
        "gpu_fraction": req.gpu_fraction,
        "mig": req.mig,
        "gpu_type": p.gpu_type if p else requested_type,
        "backend": p.backend if p else spec.backend,
        "node_names": list(p.node_names) if p else [],
        "devices": [d for s in p.slots for d in s.devices] if p else [],
        "attempt": run.attempt,
        "submitted_at": iso(run.submitted_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "reason_code": run.reason_code,
        "reason": run.reason,
        "eta": iso(run.eta),
        # an array's element: its array and index (None otherwise), so that a client folds
        # an array into one line as local mode does
        "array_id": spec.array_id,
        "array_index": spec.array_index,
    }


def event_to_public(e: Any) -> dict[str, Any]:
    """An event (``mlops_gpu.state.Event``) as ``status --events --json`` shows it."""
    return {
        "time": iso(e.time),
        "kind": e.kind,
        "phase_from": e.phase_from,
        "phase_to": e.phase_to,
        "attempt": e.attempt,
        "reason": e.reason,
        # preempting events: GPU-seconds of work thrown away (since the victim's last
        # checkpoint, else its attempt's start); null on other events
        "lost_gpu_s": None if e.lost_gpu_s is None else round(e.lost_gpu_s, 1),
    }
