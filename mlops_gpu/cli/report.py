"""``mlops-gpu report``: GPU-hours and money per project and per user, from the usage ledger.

Each ledger row is one attempt's hold on its GPUs (admission to end; shares by their share);
its cost is its GPU-hours times its GPU type's ``price_per_hour``, the same sum the scheduler
logs to MLflow as ``mlops_gpu.cost_usd``. ``--since`` keeps attempts that ended in the window.
Attempts still running are not in the ledger yet.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import click


def build_report(rows: list[Any], prices: dict[str, float], since: float | None) -> dict[str, Any]:
    by: dict[str, dict[str, dict[str, Any]]] = {"projects": {}, "users": {}}
    total = {"gpu_hours": 0.0, "cost_usd": 0.0, "attempts": 0}
    runs: dict[str, dict[str, set[str]]] = {"projects": defaultdict(set), "users": defaultdict(set)}
    for r in rows:
        hours = r.gpu_seconds / 3600
        cost = hours * prices.get(r.gpu_type, 0.0)
        for kind, key in (("projects", r.project), ("users", r.user)):
            b = by[kind].setdefault(key, {"gpu_hours": 0.0, "cost_usd": 0.0, "attempts": 0})
            b["gpu_hours"] += hours
            b["cost_usd"] += cost
            b["attempts"] += 1
            runs[kind][key].add(r.run_id)
        total["gpu_hours"] += hours
        total["cost_usd"] += cost
        total["attempts"] += 1
    out: dict[str, Any] = {"since": since}
    for kind, label in (("projects", "project"), ("users", "user")):
        out[kind] = [
            {label: k, "runs": len(runs[kind][k]), "attempts": v["attempts"],
             "gpu_hours": round(v["gpu_hours"], 6), "cost_usd": round(v["cost_usd"], 6)}
            for k, v in sorted(by[kind].items())
        ]  # fmt: skip
    out["total"] = {
        "runs": len({r.run_id for r in rows}),
        "attempts": total["attempts"],
        "gpu_hours": round(total["gpu_hours"], 6),
        "cost_usd": round(total["cost_usd"], 6),
    }
    return out


@click.command()
@click.option("--since", default=None, help="Only attempts that ended in this window, e.g. 7d.")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_context
def report(ctx: click.Context, since: str | None, fmt: str) -> None:
    """GPU-hours and cost per project and per user, from the usage ledger."""
    from mlops_gpu.cli.main import UserError, _runtime
    from mlops_gpu.cli.parse import parse_duration

    try:
        start = time.time() - parse_duration(since, "--since") if since else None
    except click.BadParameter as e:
        raise UserError(e.format_message()) from None
    rt = _runtime(ctx)
    prices = {t: g.price_per_hour for t, g in rt.cfg.model_gpu_types().items()}
    out = build_report(rt.store.usage(since=start), prices, start)
    if fmt == "json":
        click.echo(json.dumps(out, indent=2))
        return
    for kind, label in (("projects", "project"), ("users", "user")):
        click.echo(
            f"{label.upper():<20}{'RUNS':>6}{'ATTEMPTS':>10}{'GPU-HOURS':>12}{'COST USD':>12}"
        )
        for row in out[kind]:
            click.echo(
                f"{row[label]:<20}{row['runs']:>6}{row['attempts']:>10}"
                f"{row['gpu_hours']:>12.3f}{row['cost_usd']:>12.2f}"
            )
        click.echo("")
    t = out["total"]
    click.echo(f"{'TOTAL':<20}{t['runs']:>6}{t['attempts']:>10}{t['gpu_hours']:>12.3f}"
               f"{t['cost_usd']:>12.2f}")  # fmt: skip
