"""The Projects page (quota, what is held, borrowed and lent, fair share, budget spent) and
the Costs page (GPU-hours, cost and idle GPU-hours per project per UTC day), for the projects
the identity may see.

Borrowed: what a project holds beyond its nominal quota. Lent: of the GPUs a cohort's projects
borrow (of one GPU type), the part attributed to this project, in proportion to the nominal
quota it leaves unused (so lent sums to borrowed over a cohort, and never exceeds what the
project leaves unused).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from mlops_gpu.server.auth import Identity
from mlops_gpu.server.dashboard import fmt
from mlops_gpu.server.dashboard.cluster_data import Views


def _lent(v: Any) -> dict[tuple[str, str], float]:
    """(project, GPU type) -> GPUs lent to the rest of its cohort."""
    borrowed: dict[tuple[str | None, str], float] = defaultdict(float)
    unused: dict[tuple[str | None, str], dict[str, float]] = defaultdict(dict)
    for name, p in v.projects.items():
        for t in set(p.quotas) | {t for (q, t) in v.used if q == name}:
            nominal = float(p.quota(t).nominal)
            used = v.used.get((name, t), 0.0)
            borrowed[(p.cohort, t)] += max(used - nominal, 0.0)
            if nominal > used:
                unused[(p.cohort, t)][name] = nominal - used
    out: dict[tuple[str, str], float] = {}
    for key, free in unused.items():
        b, total = borrowed.get(key, 0.0), sum(free.values())
        if key[0] is None or not b or not total:
            continue
        for name, u in free.items():
            out[(name, key[1])] = min(u, b * u / total)
    return out


def projects(views: Views, who: Identity) -> list[dict[str, Any]]:
    v = views.view(with_shares=True)
    lent = _lent(v)
    pending = v.pending_by_project()
    running = v.running_by_project()
    out = []
    for name, p in sorted(v.projects.items()):
        if not who.can_see(name):
            continue
        types = sorted(set(p.quotas) | {t for (q, t) in v.used if q == name})
        quotas = []
        for t in types:
            q = p.quota(t)
            used = v.used.get((name, t), 0.0)
            quotas.append({
                "gpu_type": t,
                "nominal": q.nominal,
                "borrowing_limit": "no limit" if q.borrowing_limit is None else q.borrowing_limit,
                "lending_limit": "no limit" if q.lending_limit is None else q.lending_limit,
                "used": fmt.num(used, 2),
                "borrowed": fmt.num(max(used - q.nominal, 0.0), 2),
                "lent": fmt.num(lent.get((name, t), 0.0), 2),
            })  # fmt: skip
        budget = ""
        if p.budget is not None:
            b = p.budget
            parts = [f"{b.gpu_hours:g} GPU-h" if b.gpu_hours else "",
                     f"${b.usd:g}" if b.usd else ""]  # fmt: skip
            budget = f"{' + '.join(x for x in parts if x)} per {fmt.span(b.window_s)}"
        ratio = v.budget_ratio.get(name)
        out.append({
            "name": name,
            "cohort": p.cohort or "",
            "weight": p.weight,
            "quotas": quotas,
            "fair_share": f"{v.fair_share.get(name, 0.0):.4f}",
            "budget": budget,
            "budget_spent": f"{ratio * 100:.0f}%" if ratio is not None else "",
            "budget_over": ratio is not None and ratio >= 1.0,
            "pending": pending.get(name, 0),
            "running": running.get(name, 0),
            "role": "admin" if who.admin else (who.role(name) or ""),
        })  # fmt: skip
    return out


@dataclass
class Costs:
    days: list[dict[str, Any]]
    totals: list[dict[str, Any]]
    running: list[dict[str, Any]]
    since: str


def costs(views: Views, who: Identity, days: int, now: float) -> Costs:
    from mlops_gpu.state.dashboard_reads import DAY_S, daily_usage

    rt = views.reader.rt
    prices = {t: g.price_per_hour for t, g in rt.cfg.model_gpu_types().items()}
    since = (now // DAY_S) * DAY_S - (days - 1) * DAY_S
    rows = daily_usage(rt.store, since, who.visible_projects())
    per_day: dict[tuple[float, str], list[float]] = {}
    total: dict[str, list[float]] = {}
    for r in rows:
        usd = r.gpu_s / 3600 * prices.get(r.gpu_type, 0.0)
        for acc in (per_day.setdefault((r.day, r.project), [0, 0.0, 0.0, 0.0]),
                    total.setdefault(r.project, [0, 0.0, 0.0, 0.0])):  # fmt: skip
            acc[0] += r.attempts
            acc[1] += r.gpu_s / 3600
            acc[2] += usd
            acc[3] += r.idle_gpu_s / 3600

    def row(key: str, acc: list[float]) -> dict[str, Any]:
        return {"key": key, "attempts": int(acc[0]), "gpu_hours": fmt.num(acc[1], 2),
                "cost": fmt.num(acc[2], 2), "idle_gpu_hours": fmt.num(acc[3], 1)}  # fmt: skip

    out_days = [
        {"day": fmt.day(d), **row(p, acc)}
        for (d, p), acc in sorted(per_day.items(), key=lambda kv: (-kv[0][0], kv[0][1]))
    ]
    totals = [row(p, acc) for p, acc in sorted(total.items())]
    v = views.view(with_shares=False)
    held: dict[str, list[float]] = {}
    active = v.running_by_project()
    for (p, t), gpu_s in v.running_gpu_s.items():
        if who.can_see(p):
            acc = held.setdefault(p, [active.get(p, 0), 0.0, 0.0, 0.0])
            acc[1] += gpu_s / 3600
            acc[2] += gpu_s / 3600 * prices.get(t, 0.0)
    running = [row(p, acc) for p, acc in sorted(held.items())]
    return Costs(out_days, totals, running, fmt.day(since))
