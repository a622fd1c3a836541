"""The usage report: runs, GPU-hours, cost, utilization, wait, preemptions and wasted GPU-hours,
grouped by project, user, GPU type or day, from the usage ledger (pandas).

Each ledger row is one attempt's hold on its GPUs, from admission to its end (fractional GPUs by
their share). Its cost is its GPU-hours times its GPU type's ``price_per_hour``: the same sum the
scheduler logs to MLflow as ``mlops_gpu.cost_usd``, so the report's total and MLflow's agree.

Definitions (the JSON shape of DESIGN.md; ``attempts`` is an extra key):
- ``runs``: distinct runs with an attempt in the group; ``attempts``: ledger rows.
- ``mean_utilization``: the launcher's mean GPU utilization (percent), weighted by GPU-hours,
  over the attempts that have one; null when none has (no device, no NVML).
- ``mean_wait_s`` / ``p95_wait_s``: per attempt, admission minus the time it joined the queue
  (its submit, or its requeue); p95 by linear interpolation; null without attempts.
- ``preemptions``: attempts that ended preempted.
- ``wasted_gpu_hours``: GPU-hours of idle stretches (every GPU of the run under the idle
  threshold for at least the idle window, the window included). Not the work preemptions
  throw away: that is each ``preempting`` event's ``lost_gpu_s`` (``status --events``, MLflow's
  ``mlops_gpu.lost_gpu_s``), GPU-seconds since the victim's last checkpoint.
- ``by day``: GPU-hours, cost and wasted GPU-hours are split across the UTC days an attempt
  spans; runs, attempts, waits, preemptions and utilization count on the day the attempt ended.
  Totals never double count: ``total.runs`` is distinct runs overall.

Invariants: pure (rows and prices in, a dict out); rows sorted by key; money and hours rounded to
6 decimals only at the end.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from mlops_gpu.state import UsageRow

BY = ("project", "user", "gpu_type", "day")
DAY_S = 86400.0


def _day(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


def _pieces(r: UsageRow, by: str) -> list[tuple[str, float]]:
    """(key, fraction of the row's GPU time) for the row under ``by``."""
    if by != "day":
        return [(str(getattr(r, by)), 1.0)]
    span = r.end - r.start
    if span <= 0:
        return [(_day(r.end), 1.0)]
    out, t = [], r.start
    while t < r.end:
        edge = min((t // DAY_S + 1) * DAY_S, r.end)
        out.append((_day(t), (edge - t) / span))
        t = edge
    return out


def build_report(
    rows: Iterable[UsageRow],
    prices: Mapping[str, float],
    since: float | None,
    by: str = "project",
) -> dict[str, Any]:
    import pandas as pd

    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    rows = list(rows)
    hold, count = [], []  # GPU time per piece; per-attempt facts on one key
    for r in rows:
        hours = r.gpu_seconds / 3600
        wasted = r.gpus * r.idle_s / 3600
        cost = hours * prices.get(r.gpu_type, 0.0)
        for key, frac in _pieces(r, by):
            hold.append((key, hours * frac, cost * frac, wasted * frac))
        count.append(
            (
                _day(r.end) if by == "day" else str(getattr(r, by)),
                r.run_id,
                None if r.queued_at is None else max(r.start - r.queued_at, 0.0),
                r.outcome == "preempted",
                r.mean_util,
                hours,
            )
        )
    h = pd.DataFrame(hold, columns=["key", "gpu_hours", "cost_usd", "wasted_gpu_hours"])
    c = pd.DataFrame(count, columns=["key", "run_id", "wait_s", "preempted", "util", "hours"])
    sums = h.groupby("key").sum()
    out_rows = []
    for key in sorted(set(h["key"]) | set(c["key"])):
        g = c[c["key"] == key]
        s = sums.loc[key] if key in sums.index else None
        out_rows.append(
            {
                "key": key,
                "runs": int(g["run_id"].nunique()),
                "attempts": len(g),
                "gpu_hours": _r(s["gpu_hours"] if s is not None else 0.0),
                "cost_usd": _r(s["cost_usd"] if s is not None else 0.0),
                **_facts(g),
                "wasted_gpu_hours": _r(s["wasted_gpu_hours"] if s is not None else 0.0),
            }
        )
    total = {
        "runs": int(c["run_id"].nunique()),
        "attempts": len(c),
        "gpu_hours": _r(sum(r.gpu_seconds for r in rows) / 3600),
        "cost_usd": _r(sum(r.gpu_seconds / 3600 * prices.get(r.gpu_type, 0.0) for r in rows)),
        **_facts(c),
        "wasted_gpu_hours": _r(sum(r.gpus * r.idle_s for r in rows) / 3600),
    }
    return {"by": by, "since": since, "rows": out_rows, "total": total}


def _facts(g: Any) -> dict[str, Any]:
    """Utilization, waits and preemptions of a group of attempts (a DataFrame)."""
    waits = g["wait_s"].dropna()
    util = g.dropna(subset=["util"])
    weight = float(util["hours"].sum())
    if len(util) and weight > 0:
        mean_util: float | None = float((util["util"] * util["hours"]).sum() / weight)
    elif len(util):
        mean_util = float(util["util"].mean())
    else:
        mean_util = None
    return {
        "mean_utilization": None if mean_util is None else round(mean_util, 3),
        "mean_wait_s": round(float(waits.mean()), 3) if len(waits) else None,
        "p95_wait_s": round(float(waits.quantile(0.95)), 3) if len(waits) else None,
        "preemptions": int(g["preempted"].sum()),
    }


def _r(x: float) -> float:
    return round(float(x), 6)
