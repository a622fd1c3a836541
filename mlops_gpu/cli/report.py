"""``mlops-gpu report``: runs, GPU-hours, cost, utilization, waits, preemptions and wasted
GPU-hours per project, user, GPU type or day, from the usage ledger
(``controller.usage_report`` holds the definitions). Attempts still running are not in the ledger
yet; ``--since`` keeps attempts that ended in the window.
"""

from __future__ import annotations

import csv
import io
import json
import time
from typing import Any

import click

from mlops_gpu.cli.safe_text import CELL_LIMIT, visible

# the report's groupings (``controller.usage_report.BY``), here so the CLI imports no controller
BY = ("project", "user", "gpu_type", "day")

COLUMNS = [
    ("runs", "RUNS", "{:d}"),
    ("attempts", "ATTEMPTS", "{:d}"),
    ("gpu_hours", "GPU-HOURS", "{:.3f}"),
    ("cost_usd", "COST USD", "{:.2f}"),
    ("mean_utilization", "UTIL %", "{:.1f}"),
    ("mean_wait_s", "WAIT S", "{:.1f}"),
    ("p95_wait_s", "P95 WAIT S", "{:.1f}"),
    ("preemptions", "PREEMPTED", "{:d}"),
    ("wasted_gpu_hours", "WASTED GPU-H", "{:.3f}"),
]


def to_csv(out: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([out["by"], *(k for k, _, _ in COLUMNS)])
    for row in out["rows"]:
        w.writerow([row["key"], *("" if row[k] is None else row[k] for k, _, _ in COLUMNS)])
    return buf.getvalue()


def to_table(out: dict[str, Any]) -> str:
    def cells(row: dict[str, Any]) -> list[str]:
        return ["-" if row[k] is None else f.format(row[k]) for k, _, f in COLUMNS]

    head = [out["by"].upper(), *(h for _, h, _ in COLUMNS)]
    # project and user names are the users': shown literally, a long one cut (safe_text)
    body = [[visible(r["key"], CELL_LIMIT), *cells(r)] for r in out["rows"]]
    body.append(["TOTAL", *cells(out["total"])])
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]

    def line(cols: list[str]) -> str:
        first = cols[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cols[1:], widths[1:], strict=True))])

    return "\n".join([line(head), *(line(b) for b in body)])


def plot(out: dict[str, Any], path: str) -> Any:
    """Write the bar chart to ``path`` and return its figure (closed; tests read its layout).
    The legend sits below the axes, outside the plotting area, so it never covers a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [r["key"] for r in out["rows"]]
    used = [r["gpu_hours"] - r["wasted_gpu_hours"] for r in out["rows"]]
    wasted = [r["wasted_gpu_hours"] for r in out["rows"]]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * len(keys) + 2), 4.6))
    ax.bar(keys, used, label="GPU-hours")
    ax.bar(keys, wasted, bottom=used, label="wasted (idle) GPU-hours", hatch="//", alpha=0.6)
    ax.set_ylabel("GPU-hours")
    ax.set_title(f"GPU-hours by {out['by']} (total ${out['total']['cost_usd']:.2f})")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    # a figure legend under the x labels: tight_layout leaves room for it (a legend inside the
    # axes covered the tallest bar)
    fig.legend(loc="lower center", ncols=2, frameon=False)
    fig.tight_layout(rect=(0.0, 0.08, 1.0, 1.0))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig


@click.command()
@click.option(
    "--by", type=click.Choice(BY), default="project", show_default=True, help="Group rows by."
)
@click.option("--since", default=None, help="Only attempts that ended in this window, e.g. 7d.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), help="Also write a bar chart (PNG)."
)
@click.pass_context
def report(ctx: click.Context, by: str, since: str | None, fmt: str, plot_path: str | None) -> None:
    """GPU-hours, cost, utilization, waits, preemptions and wasted GPU-hours from the ledger."""
    from mlops_gpu.cli.common import UserError, open_runtime
    from mlops_gpu.cli.parse import parse_duration
    from mlops_gpu.controller.usage_report import build_report

    try:
        start = time.time() - parse_duration(since, "--since") if since else None
    except click.BadParameter as e:
        raise UserError(e.format_message()) from None
    from mlops_gpu.cli import remote_cmds as remote

    if (target := remote.remote_target(ctx)) is not None:
        out = remote.report(target, by, start)  # the server's ledger, as its identity sees it
    else:
        rt = open_runtime(ctx)
        prices = {t: g.price_per_hour for t, g in rt.cfg.model_gpu_types().items()}
        out = build_report(rt.store.usage(since=start), prices, start, by)
    if plot_path:
        try:
            plot(out, plot_path)
        except OSError as e:
            raise UserError(f"--plot {plot_path}: {e}") from None
    if fmt == "json":
        click.echo(json.dumps(out, indent=2))
    elif fmt == "csv":
        click.echo(to_csv(out), nl=False)
    else:
        click.echo(to_table(out))
        if plot_path:
            click.echo(f"wrote {plot_path}")
