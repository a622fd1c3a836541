"""``mlops-gpu simulate``: replay a trace under one or more policies and compare them.

Heavy parts (the simulator, matplotlib for ``--plot``) are imported when the verb runs, so the
CLI's start-up stays light. Progress goes to stderr; ``--json`` prints one JSON object on stdout.
"""

from __future__ import annotations

import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

import click

DATA = Path(__file__).resolve().parent.parent / "sim" / "data"


def _load(trace: str, start: str | None, days: float | None, gpus_per_node: int, seed: int) -> Any:
    from mlops_gpu.sim.trace import load_csv, load_philly, synthetic

    if trace == "philly":
        try:
            day = date.fromisoformat(start) if start else date(2017, 10, 9)
        except ValueError:
            raise click.BadParameter(
                f"expected YYYY-MM-DD, got {start!r}", param_hint="--start"
            ) from None
        return load_philly(
            DATA / "philly.csv.gz",
            DATA / "philly_vc_nodes.csv",
            day,
            7.0 if days is None else days,
            gpus_per_node,
        )
    if trace == "synthetic":
        return synthetic(seed=seed, days=2.0 if days is None else days, gpus_per_node=gpus_per_node)
    if trace == "openb":
        from mlops_gpu.sim.openb import load_openb

        try:
            first = float(start) if start is not None else 0.0
        except ValueError:
            raise click.BadParameter(
                f"openb: expected a day number (days from the trace's start), got {start!r}",
                param_hint="--start",
            ) from None
        return load_openb(start_day=first, days=days)
    if start is not None or days is not None:
        raise click.BadParameter(
            "only for --trace philly, openb or synthetic", param_hint="--start/--days"
        )
    return load_csv(trace, gpus_per_node)


@click.command()
@click.option(
    "--trace",
    "trace_name",
    default="philly",
    show_default=True,
    help="philly (the vendored Philly trace), openb (the vendored Alibaba GPU-sharing trace, "
    "on its own 1,213 nodes), synthetic (seeded), or a CSV path (format: BENCHMARKS.md).",
)
@click.option(
    "--start",
    default=None,
    help="philly: first day, YYYY-MM-DD (default 2017-10-09); openb: first day as days from "
    "the trace's start (default 0; most pods arrive after day 118).",
)
@click.option(
    "--days",
    type=float,
    default=None,
    help="Days of submissions (philly default 7, synthetic 2, openb all).",
)
@click.option("--nodes", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    help="Policy to run (repeatable): default, fifo-backfill, kueue-like, drf, las, fifo, "
    "srtf-oracle (all of them when none is named).",
)
@click.option("--seed", type=int, default=1, show_default=True, help="synthetic: the seed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--plot",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write PNG plots (JCT CDF, utilization, share per project) to this folder.",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "reference", "native", "python"]),
    default="auto",
    show_default=True,
    help="The core's engine: native (Rust; built by the install where cargo exists) where "
    "installed, else the Python reference (the same decisions, about 30x slower; 'python' is "
    "its former name); 'native' fails where the extension is not installed.",
)
@click.option(
    "--autoscale",
    is_flag=True,
    help="Replay on an elastic pool instead (the config's pool, or --pool): our scaler, a "
    "reactive baseline (cluster-autoscaler-like) and always-on, side by side, with node-hours "
    "and cost (on --engine).",
)
@click.option(
    "--pool",
    "pool_spec",
    default=None,
    metavar="NAME|KEY=VALUE,...",
    help="--autoscale: a pool of the config, or its keys, e.g. "
    "max_nodes=64,gpus_per_node=8,boot_s=300,price_per_node_hour=10,idle_s=600.",
)
@click.pass_context
def simulate(
    ctx: click.Context,
    trace_name: str,
    start: str | None,
    days: float | None,
    nodes: int,
    gpus_per_node: int,
    policies: tuple[str, ...],
    seed: int,
    as_json: bool,
    plot: Path | None,
    engine: str,
    autoscale: bool,
    pool_spec: str | None,
) -> None:
    """Replay a GPU cluster trace under scheduling policies, side by side."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.sim import Cluster
    from mlops_gpu.sim.compare import DEFAULT_POLICIES, compare
    from mlops_gpu.sim.policies import PRESETS
    from mlops_gpu.sim.trace import TraceError

    chosen = policies or (("default",) if autoscale else DEFAULT_POLICIES)
    for p in chosen:
        if p not in PRESETS:
            raise UserError(f"--policy {p}: unknown; expected one of {', '.join(PRESETS)}")
    if pool_spec is not None and not autoscale:
        raise UserError("--pool: only with --autoscale")
    if autoscale:
        from mlops_gpu.cli.simulate_pool import choose_pool

        pool = choose_pool(pool_spec, (ctx.obj or {}).get("config"))
        if len(chosen) > 1 or trace_name == "openb":
            raise UserError("--autoscale: one --policy at a time, on a trace without its own nodes")
        gpus_per_node = pool.gpus_per_node
    try:
        trace = _load(trace_name, start, days, gpus_per_node, seed)
    except TraceError as e:
        raise UserError(str(e)) from None
    if autoscale:
        _autoscale(trace, pool, chosen[0], as_json, engine)
        return
    if trace.nodes:  # the trace brings its own cluster
        cluster = Cluster(len(trace.nodes), 0, node_list=trace.nodes)
        shape = f"its {len(trace.nodes)} nodes ({cluster.gpus} GPUs)"
    else:
        cluster = Cluster(nodes, gpus_per_node)
        shape = f"{nodes} x {gpus_per_node} GPUs"
    click.echo(f"simulate: {trace.name}: {len(trace.jobs)} jobs on {shape}", err=True)

    def progress(p: str, done: int, total: int) -> None:
        click.echo(f"\r  {p}: {done}/{total} jobs finished", err=True, nl=False)

    def finished(r: Any) -> None:
        click.echo(
            f"\r  {r.policy}: done in {r.wall_s:.1f}s ({r.engine} engine){' ' * 12}", err=True
        )

    try:
        out, results = compare(
            trace, cluster, chosen, progress=progress, done=finished, engine=engine
        )
    except ValueError as e:  # a trace the cluster cannot express (priorities, types)
        raise UserError(str(e)) from None
    if plot is not None:
        from mlops_gpu.sim.plots import write_plots

        for path in write_plots(results, plot):
            click.echo(f"wrote {path}", err=True)
    if as_json:
        click.echo(json.dumps(out))
        return
    _table(out)


def _autoscale(trace: Any, pool: Any, policy: str, as_json: bool, engine: str) -> None:
    from mlops_gpu.cli.simulate_pool import table
    from mlops_gpu.sim.autoscale import compare_scalers

    click.echo(
        f"simulate --autoscale: {trace.name}: {len(trace.jobs)} jobs on up to "
        f"{pool.max_nodes} x {pool.gpus_per_node} GPUs (boot {pool.boot_s:g} s)",
        err=True,
    )

    def finished(r: Any) -> None:
        click.echo(f"  {r.policy}: done in {r.wall_s:.1f}s ({r.engine} engine)", err=True)

    try:
        out = compare_scalers(trace, pool, policy, done=finished, engine=engine)
    except ValueError as e:
        from mlops_gpu.cli.common import UserError

        raise UserError(str(e)) from None
    if as_json:
        click.echo(json.dumps(out))
        return
    table(out)
    sys.stdout.flush()


def _table(out: dict[str, Any]) -> None:
    from mlops_gpu.cli.render import results_table

    cols = [
        ("policy", "policy", "{}"),
        ("avg JCT h", "avg_jct_s", "h"),
        ("p99 JCT h", "p99_jct_s", "h"),
        ("avg wait h", "avg_wait_s", "h"),
        ("slowdown", "avg_slowdown", "{:.2f}"),
        ("util", "utilization", "{:.3f}"),
        ("gap closed", "gap_closed", "{:.2f}"),
        ("Jain", "jain", "{:.3f}"),
        ("windows", "jain_windows", "{}"),
        ("quota viol.", "quota_violations", "{}"),
        ("preempt", "preemptions", "{}"),
        ("lost GPU-h", "lost_gpu_hours", "{:.1f}"),
        ("wall s", "wall_s", "{:.1f}"),
    ]
    results_table(f"{out['trace']}: {out['jobs']} jobs, {out['gpus']} GPUs", cols, out["results"])
    sys.stdout.flush()
