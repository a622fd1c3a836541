"""``mlops-gpu``: init, demo, submit, queue, status, update, history, logs, cancel, nodes, top,
metrics, scheduler, simulate, server, users, audit, login.

With ``MLOPS_GPU_URL`` set, or after ``login`` (and no ``--config``), ``submit``, ``status``,
``queue``, ``update``, ``history``, ``cancel``, ``logs``, ``nodes``, ``report`` and ``top`` talk
to a ``mlops-gpu server`` (``cli.remote_cmds``, ``cli.top``) and open no store.

Every read verb takes ``--json`` (the run keys of DESIGN.md). Errors are one line on stderr,
``mlops-gpu: error: ...``, with exit status 2 for bad input and 1 for other failures (a store or
state folder that cannot be used: ``SetupError``, naming the file and what to do).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from mlops_gpu.cli import remote_cmds as remote
from mlops_gpu.cli.common import UserError, ids_of, local_me, open_runtime, user_options, whose
from mlops_gpu.cli.errors import SetupErrorsAsOneLine
from mlops_gpu.cli.safe_text import visible

CONFIG_HELP = "Config file (default: $MLOPS_GPU_CONFIG, ./mlops-gpu.yaml, ~/.config/mlops-gpu/)."


def _dump(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2))


@click.group(cls=SetupErrorsAsOneLine, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config", metavar="PATH", default=None, help=CONFIG_HELP)
@click.version_option(package_name="mlops-gpu")
@click.pass_context
def cli(ctx: click.Context, config: str | None) -> None:
    """mlops-gpu: a GPU scheduler for ML teams (quotas, fair sharing, explainable queues)."""
    ctx.ensure_object(dict)
    ctx.obj["config"] = config


@cli.command()
@click.option("--path", default="mlops-gpu.yaml", show_default=True, help="Where to write it.")
@click.option(
    "--virtual-gpus",
    type=click.IntRange(min=1, max=4096),  # the config's bound on a node's GPUs
    default=None,
    help="Use N virtual GPUs instead of the GPUs NVML finds.",
)
@click.option(
    "--gpu-type", default="a100-80gb", show_default=True, help="GPU type name of the virtual GPUs."
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(path: str, virtual_gpus: int | None, gpu_type: str, force: bool) -> None:
    """Write a commented starter config with this host's GPUs (or virtual ones)."""
    from mlops_gpu.controller.setup import write_starter

    try:
        said = write_starter(path, virtual_gpus=virtual_gpus, gpu_type=gpu_type, force=force)
        click.echo(visible(said))
    except (FileExistsError, ValueError) as e:
        raise UserError(str(e)) from None
    except OSError as e:  # a folder that cannot be made or written
        raise UserError(f"--path {path}: {e.strerror}") from None


@cli.command()
@click.option(
    "--dir",
    "directory",
    default="mlops-gpu-demo",
    show_default=True,
    help="Folder for the demo's config, state and MLflow store.",
)
@click.option(
    "--runs",
    "scale",
    type=click.IntRange(1, 5),
    default=1,
    show_default=True,
    help="Scale the workload mix (1 = 12 runs).",
)
def demo(directory: str, scale: int) -> None:
    """Run a small multi-project workload on virtual GPUs and summarise it."""
    from mlops_gpu.cli.demo import run_demo

    sys.exit(run_demo(directory, scale=scale))


@cli.command()
@click.option("--project", "-p", default=None, help="Only this project.")
@user_options
@click.option("--json", "as_json", is_flag=True, help="Print runs as a JSON list.")
@click.option("--expand", is_flag=True, help="One line per array element (JSON always is).")
@click.pass_context
def queue(
    ctx: click.Context,
    project: str | None,
    user: str | None,
    mine: bool,
    as_json: bool,
    expand: bool,
) -> None:
    """Pending runs (highest class, then oldest first) with the reason each waits and its ETA."""
    from mlops_gpu.cli.render import runs_table
    from mlops_gpu.cli.scheduler_cmd import warn_if_none
    from mlops_gpu.controller.views import queue_runs
    from mlops_gpu.model.public import run_to_public

    if (target := remote.remote_target(ctx)) is not None:
        remote.queue(target, project, as_json, user, mine, expand)
        return
    rt = open_runtime(ctx)
    runs = queue_runs(rt, project, whose(user, mine, local_me))
    if as_json:
        _dump([run_to_public(r) for r in runs])
    else:
        runs_table(runs, title=f"Queue: {len(runs)} pending", with_reason=True, expand=expand)
    warn_if_none(rt)


@cli.command()
@click.argument("run_ids", nargs=-1)
@click.option("--project", "-p", default=None, help="Only this project.")
@click.option("--all", "show_all", is_flag=True, help="Include every finished run.")
@click.option("--limit", type=int, default=50, show_default=True, help="Newest runs shown.")
@click.option("--events", is_flag=True, help="Add each run's event history (why it moved).")
@user_options
@click.option("--json", "as_json", is_flag=True, help="Print runs as a JSON list.")
@click.option("--expand", is_flag=True, help="One line per array element (JSON always is).")
@click.pass_context
def status(
    ctx: click.Context,
    run_ids: tuple[str, ...],
    project: str | None,
    show_all: bool,
    limit: int,
    events: bool,
    user: str | None,
    mine: bool,
    as_json: bool,
    expand: bool,
) -> None:
    """Runs and their phases (the newest first), or the runs named."""
    from mlops_gpu.cli.render import events_table, runs_table
    from mlops_gpu.cli.scheduler_cmd import warn_if_none
    from mlops_gpu.controller.views import user_runs
    from mlops_gpu.model.public import event_to_public, run_to_public

    if (target := remote.remote_target(ctx)) is not None:
        lim = None if show_all else limit
        remote.status(target, run_ids, project, lim, events, as_json, user, mine, expand)
        return
    rt = open_runtime(ctx)
    who = whose(user, mine, local_me)
    if run_ids:
        ids = [i for rid in run_ids for i in ids_of(rt, rid)]
        runs = [r for r in (rt.store.get(i) for i in ids) if who in (None, r.spec.user)]
    else:
        runs = user_runs(rt.store, project, who, None if show_all else limit)
    history = {r.id: rt.store.events(r.id) for r in runs} if events else {}
    if as_json:
        out = [run_to_public(r) for r in runs]
        for item in out if events else ():
            item["events"] = [event_to_public(e) for e in history[item["id"]]]
        _dump(out)
        warn_if_none(rt)
        return
    runs_table(runs, title="Runs", with_reason=True, expand=expand or events)
    for r in runs if events else ():
        events_table(r.id, history[r.id])
    warn_if_none(rt)  # (after the output: an error above is the only line then)


def _get_run(rt: Any, run_id: str) -> Any:
    run = rt.store.get(run_id)
    if run is None:
        raise UserError(f"no run with id {run_id!r}")
    return run


@cli.command()
@click.argument("run_id")
@click.option("--attempt", type=int, default=None, help="Attempt (default: the latest).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the run ends.")
@click.pass_context
def logs(ctx: click.Context, run_id: str, attempt: int | None, follow: bool) -> None:
    """Print a run's stdout, then its stderr."""
    from mlops_gpu.cli.logs import print_logs

    if (target := remote.remote_target(ctx)) is not None:
        sys.exit(remote.logs(target, run_id, attempt, follow))
    rt = open_runtime(ctx)
    sys.exit(print_logs(rt, _get_run(rt, run_id), attempt, follow))


@cli.command()
@click.argument("run_ids", nargs=-1, required=True)
@click.pass_context
def cancel(ctx: click.Context, run_ids: tuple[str, ...]) -> None:
    """Cancel runs: pending ones at once, running ones by their checkpoint signal."""
    from mlops_gpu.controller.views import cancel_run

    if (target := remote.remote_target(ctx)) is not None:
        remote.cancel(target, run_ids)
        return
    rt = open_runtime(ctx)
    for rid in [i for given in run_ids for i in ids_of(rt, given)]:
        _phase, what = cancel_run(rt, rid)
        click.echo(f"{rid}: {what}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print nodes as a JSON list.")
@click.pass_context
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Nodes of every backend with their free GPUs."""
    from mlops_gpu.cli.render import nodes_table
    from mlops_gpu.controller.views import node_rows

    if (target := remote.remote_target(ctx)) is not None:
        remote.nodes(target, as_json)
        return
    rt = open_runtime(ctx)
    if as_json:
        _dump(node_rows(rt))
    else:
        nodes_table(node_rows(rt, with_state_reason=True))


def _register() -> None:
    from mlops_gpu.cli.exec_cmd import exec_
    from mlops_gpu.cli.jobs import history, update
    from mlops_gpu.cli.metrics_cmd import metrics
    from mlops_gpu.cli.report import report
    from mlops_gpu.cli.scheduler_cmd import scheduler
    from mlops_gpu.cli.simulate import simulate
    from mlops_gpu.cli.submit_cmd import hold, release, submit
    from mlops_gpu.cli.team import audit, server, users
    from mlops_gpu.cli.top import top

    cli.add_command(submit)
    cli.add_command(hold)
    cli.add_command(release)
    cli.add_command(simulate)
    cli.add_command(server)
    cli.add_command(remote.login)
    cli.add_command(users)
    cli.add_command(audit)
    cli.add_command(report)
    cli.add_command(metrics)
    cli.add_command(top)
    cli.add_command(scheduler)  # (scheduler, scheduler run|status|stop|restart)
    cli.add_command(update)
    cli.add_command(history)
    cli.add_command(exec_)


_register()


def main() -> None:
    try:
        cli(prog_name="mlops-gpu")
    except KeyboardInterrupt:
        click.echo("mlops-gpu: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
