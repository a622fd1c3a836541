"""A scheduled flow (daily in ``prefect.yaml``) that writes the GPU-hours and cost report: the
figures of ``mlops-gpu report`` over the last ``days`` days, by project and by user, as JSON and
CSV files in ``out_dir`` and as a Markdown table artifact on the flow run.

It needs no GPU: deployed to the ``mlops-gpu`` pool with ``gpus: 0`` it is a CPU-only run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import flow


def _table(out: dict[str, Any]) -> str:
    head = f"| {out['by']} | runs | GPU-hours | cost USD | wasted GPU-hours | p95 wait s |\n"
    head += "| --- | --- | --- | --- | --- | --- |\n"

    def wait(r: dict[str, Any]) -> str:
        return "-" if r["p95_wait_s"] is None else f"{r['p95_wait_s']:.0f}"

    rows = [
        f"| {r['key']} | {r['runs']} | {r['gpu_hours']:.3f} | {r['cost_usd']:.2f} "
        f"| {r['wasted_gpu_hours']:.3f} | {wait(r)} |"
        for r in out["rows"]
    ]
    t = out["total"]
    rows.append(f"| **total** | {t['runs']} | {t['gpu_hours']:.3f} | {t['cost_usd']:.2f} "
                f"| {t['wasted_gpu_hours']:.3f} | |")  # fmt: skip
    return head + "\n".join(rows) + "\n"


@flow(log_prints=True)
def usage_report(
    days: float = 7.0, out_dir: str = "reports", config: str | None = None
) -> dict[str, Any]:
    """The report by project and by user; returns the by-project report."""
    from prefect.artifacts import create_markdown_artifact

    from mlops_gpu.cli.report import to_csv
    from mlops_gpu.controller import Runtime
    from mlops_gpu.controller.usage_report import build_report

    rt = Runtime.load(config)
    since = time.time() - days * 86400
    prices = {t: g.price_per_hour for t, g in rt.cfg.model_gpu_types().items()}
    rows = rt.store.usage(since=since)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    reports = {by: build_report(rows, prices, since, by) for by in ("project", "user")}
    markdown = ""
    for by, rep in reports.items():
        (out / f"usage-{stamp}-by-{by}.json").write_text(json.dumps(rep, indent=2))
        (out / f"usage-{stamp}-by-{by}.csv").write_text(to_csv(rep))
        markdown += f"### By {by}\n\n{_table(rep)}\n"
    create_markdown_artifact(markdown, key="gpu-usage", description=f"last {days:g} days")
    total = reports["project"]["total"]
    print(f"{total['gpu_hours']:.3f} GPU-hours, ${total['cost_usd']:.2f} in the last {days:g} days")
    return reports["project"]


if __name__ == "__main__":
    usage_report()
