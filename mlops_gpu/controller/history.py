"""The accounting view of finished runs (``mlops-gpu history``, ``GET /api/v1/history``), one
dict per run with the same keys on every edge:

``id, name, project, user, phase, gpu_type, gpus, num_nodes, submitted_at, started_at,
finished_at, elapsed_s, gpu_hours, cost_usd, exit_code, attempts, lost_gpu_hours, reason``

- ``started_at``/``elapsed_s``: the last attempt's start and its time to the end (null for a run
  that never started).
- ``gpu_hours``/``cost_usd``: over every attempt, from the usage ledger (admission to end, as
  ``report`` counts them), each GPU type at its ``price_per_hour``.
- ``lost_gpu_hours``: work its preemptions threw away (since the last checkpoint).
- ``attempts``: how many attempts the run had.

Times are ISO 8601 UTC (``model.public.iso``); hours and money rounded to 6 decimals. Reads only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.model.public import iso, run_to_public
from mlops_gpu.state.history import Finished, finished_runs

HISTORY_KEYS = (
    "id", "name", "project", "user", "phase", "gpu_type", "gpus", "num_nodes", "submitted_at",
    "started_at", "finished_at", "elapsed_s", "gpu_hours", "cost_usd", "exit_code", "attempts",
    "lost_gpu_hours", "reason",
)  # fmt: skip
_FROM_RUN = HISTORY_KEYS[:9]  # (id .. submitted_at: as ``run_to_public`` has them)
#: Default window and bounds of ``--limit``.
DEFAULT_SINCE_S = 86400.0
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000


def history_row(f: Finished, prices: Mapping[str, float]) -> dict[str, Any]:
    run = f.run
    pub = run_to_public(run)
    start, end = run.started_at, run.finished_at
    gpu_s = sum(f.gpu_s_by_type.values())
    cost = sum(s / 3600 * prices.get(t, 0.0) for t, s in f.gpu_s_by_type.items())
    return {
        **{k: pub[k] for k in _FROM_RUN},
        "started_at": iso(start),
        "finished_at": iso(end),
        "elapsed_s": round(end - start, 3) if start is not None and end is not None else None,
        "gpu_hours": round(gpu_s / 3600, 6),
        "cost_usd": round(cost, 6),
        "exit_code": run.exit_code,
        "attempts": run.attempt,
        "lost_gpu_hours": round(f.lost_gpu_s / 3600, 6),
        "reason": run.reason,
    }


def history_rows(
    rt: Runtime,
    *,
    since: float,
    projects: Collection[str] | None = None,
    user: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """Finished runs ending at or after ``since``, newest end first (``state.history``)."""
    prices = {t: g.price_per_hour for t, g in rt.cfg.model_gpu_types().items()}
    found = finished_runs(rt.store, since=since, projects=projects, user=user, limit=limit)
    return [history_row(f, prices) for f in found]
