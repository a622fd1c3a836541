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
from mlops_gpu.cli.errors import SetupErrorsAsOneLine
from mlops_gpu.cli.jobs import local_me, user_options, whose
from mlops_gpu.cli.parse import parse_duration, parse_env
from mlops_gpu.cli.safe_text import visible

CONFIG_HELP = "Config file (default: $MLOPS_GPU_CONFIG, ./mlops-gpu.yaml, ~/.config/mlops-gpu/)."


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"mlops-gpu: error: {visible(self.format_message())}", err=True)


def _runtime(ctx: click.Context) -> Any:
    from mlops_gpu.config import ConfigError
    from mlops_gpu.controller import Runtime

    try:
        return Runtime.load(ctx.obj["config"])
    except ConfigError as e:
        raise UserError(str(e)) from None


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


@cli.command(context_settings={"ignore_unknown_options": False})
@click.option("--project", "-p", required=True, help="Project (tenant) to charge.")
@click.option("--gpus", "-g", type=int, default=1, show_default=True, help="GPUs per node.")
@click.option("--nodes", "-N", type=int, default=1, show_default=True, help="Nodes (a gang).")
@click.option(
    "--gpu-type",
    "-t",
    "gpu_types",
    multiple=True,
    help="Acceptable GPU type (repeat for any of several).",
)
@click.option(
    "--gpu-fraction",
    type=float,
    default=None,
    help="Share of one GPU (0..1) on a node that shares GPUs.",
)
@click.option(
    "--gpu-memory",
    "gpu_memory_mb",
    type=int,
    default=None,
    help="Memory cap in MB on a shared GPU.",
)
@click.option("--mig", default=None, help="MIG profile, e.g. 1g.10gb (--gpus slices of it).")
@click.option(
    "--cpu",
    "cpu_milli",
    type=int,
    default=0,
    help="Host CPU per node in millicores (4000 = 4 cores); with --gpus 0, a CPU-only run.",
)
@click.option(
    "--memory",
    "host_memory_mb",
    type=int,
    default=0,
    help="Host memory per node in MB.",
)
@click.option(
    "--topology",
    "topology_key",
    default=None,
    help="Node label the gang's nodes share, e.g. rack (preferred).",
)
@click.option("--topology-required", is_flag=True, help="Make --topology a requirement.")
@click.option("--priority", default=None, help="Priority class (default from config).")
@click.option("--name", "-n", default=None, help="Run name (default: the command).")
@click.option("--max-runtime", default=None, help="Stop after this long, e.g. 2h.")
@click.option("--experiment", default=None, help="MLflow experiment name.")
@click.option("--backend", default=None, help="Pin to one configured backend.")
@click.option("--non-preemptible", is_flag=True, help="Never preempt this run.")
@click.option(
    "--signal",
    "stop_signal",
    default="SIGTERM",
    show_default=True,
    help="Checkpoint signal sent on cancel or preemption.",
)
@click.option(
    "--grace",
    default="30s",
    show_default=True,
    help="Time between the checkpoint signal and SIGKILL.",
)
@click.option("--env", "-e", "env", multiple=True, metavar="KEY=VALUE", help="Extra env var.")
@click.option("--workdir", default=None, help="Working directory (default: the current one).")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=None,
    help="Attempts before a preempted or lost run fails (default from config).",
)
@click.option("--no-start", is_flag=True, help="Do not start a background scheduler.")
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@click.argument("command", nargs=-1, required=True)
@click.pass_context
def submit(
    ctx: click.Context,
    project: str,
    gpus: int,
    nodes: int,
    gpu_types: tuple[str, ...],
    gpu_fraction: float | None,
    gpu_memory_mb: int | None,
    mig: str | None,
    cpu_milli: int,
    host_memory_mb: int,
    topology_key: str | None,
    topology_required: bool,
    priority: str | None,
    name: str | None,
    max_runtime: str | None,
    experiment: str | None,
    backend: str | None,
    non_preemptible: bool,
    stop_signal: str,
    grace: str,
    env: tuple[str, ...],
    workdir: str | None,
    max_attempts: int | None,
    no_start: bool,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Queue COMMAND (after --) as a run; prints the run id."""
    import os
    import signal as signal_mod

    from mlops_gpu.controller import SubmitError
    from mlops_gpu.model import CheckpointPolicy, ResourceRequest
    from mlops_gpu.model.public import run_to_public
    from mlops_gpu.model.text import spec_text_problems

    sig = stop_signal.upper() if stop_signal.upper().startswith("SIG") else "SIG" + stop_signal
    if not isinstance(getattr(signal_mod, sig, None), signal_mod.Signals):
        raise UserError(f"--signal: unknown signal {stop_signal!r}")
    try:
        grace_s = 0.0 if grace.strip() in ("0", "0s") else parse_duration(grace, "--grace")
        runtime_s = parse_duration(max_runtime, "--max-runtime") if max_runtime else None
        env_map = parse_env(env)
    except click.BadParameter as e:
        raise UserError(e.format_message()) from None
    if (target := remote.remote_target(ctx)) is not None:
        body = {"command": list(command), "project": project, "name": name, "gpus": gpus,
                "nodes": nodes, "gpu_types": list(gpu_types), "gpu_fraction": gpu_fraction,
                "gpu_memory_mb": gpu_memory_mb, "mig": mig, "cpu_milli": cpu_milli,
                "host_memory_mb": host_memory_mb, "topology_key": topology_key,
                "topology_required": topology_required, "priority": priority,
                "max_runtime_s": runtime_s, "experiment": experiment, "backend": backend,
                "preemptible": not non_preemptible, "signal": sig, "grace_s": grace_s,
                "env": env_map, "workdir": workdir, "max_attempts": max_attempts}  # fmt: skip
        remote.submit(target, body, as_json)
        return
    rt = _runtime(ctx)
    spec = rt.spec(
        tuple(command),
        project=project,
        name=name,
        priority=priority,
        request=ResourceRequest(
            gpus=gpus,
            nodes=nodes,
            gpu_types=gpu_types,
            gpu_fraction=gpu_fraction,
            gpu_memory_mb=gpu_memory_mb,
            mig=mig,
            topology_key=topology_key,
            topology_required=topology_required,
            cpu_milli=cpu_milli,
            host_memory_mb=host_memory_mb,
        ),
        max_runtime_s=runtime_s,
        preemptible=not non_preemptible,
        checkpoint=CheckpointPolicy(sig, grace_s),
        experiment=experiment,
        env=env_map,
        workdir=os.path.abspath(workdir or os.getcwd()),
        backend=backend,
        max_attempts=max_attempts,
    )
    try:
        # argv is checked by ArgsGroup; the working directory and user name are not argv
        if problems := spec_text_problems(spec):
            raise SubmitError("; ".join(problems))
        run = rt.submit(spec, start_scheduler=not no_start)
    except SubmitError as e:
        raise UserError(str(e)) from None
    click.echo(json.dumps(run_to_public(run)) if as_json else run.id)


@cli.command()
@click.option("--project", "-p", default=None, help="Only this project.")
@user_options
@click.option("--json", "as_json", is_flag=True, help="Print runs as a JSON list.")
@click.pass_context
def queue(
    ctx: click.Context, project: str | None, user: str | None, mine: bool, as_json: bool
) -> None:
    """Pending runs (highest class, then oldest first) with the reason each waits and its ETA."""
    from mlops_gpu.cli.render import runs_table
    from mlops_gpu.cli.scheduler_cmd import warn_if_none
    from mlops_gpu.controller.views import queue_runs
    from mlops_gpu.model.public import run_to_public

    if (target := remote.remote_target(ctx)) is not None:
        remote.queue(target, project, as_json, user, mine)
        return
    rt = _runtime(ctx)
    runs = queue_runs(rt, project, whose(user, mine, local_me))
    if as_json:
        _dump([run_to_public(r) for r in runs])
    else:
        runs_table(runs, title=f"Queue: {len(runs)} pending", with_reason=True)
    warn_if_none(rt)


@cli.command()
@click.argument("run_ids", nargs=-1)
@click.option("--project", "-p", default=None, help="Only this project.")
@click.option("--all", "show_all", is_flag=True, help="Include every finished run.")
@click.option("--limit", type=int, default=50, show_default=True, help="Newest runs shown.")
@click.option("--events", is_flag=True, help="Add each run's event history (why it moved).")
@user_options
@click.option("--json", "as_json", is_flag=True, help="Print runs as a JSON list.")
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
) -> None:
    """Runs and their phases (the newest first), or the runs named."""
    from mlops_gpu.cli.render import events_table, runs_table
    from mlops_gpu.cli.scheduler_cmd import warn_if_none
    from mlops_gpu.controller.views import user_runs
    from mlops_gpu.model.public import event_to_public, run_to_public

    if (target := remote.remote_target(ctx)) is not None:
        lim = None if show_all else limit
        remote.status(target, run_ids, project, lim, events, as_json, user, mine)
        return
    rt = _runtime(ctx)
    who = whose(user, mine, local_me)
    if run_ids:
        runs = [r for r in (_get_run(rt, rid) for rid in run_ids) if who in (None, r.spec.user)]
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
    runs_table(runs, title="Runs", with_reason=True)
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
    rt = _runtime(ctx)
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
    rt = _runtime(ctx)
    for rid in run_ids:
        _get_run(rt, rid)
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
    rt = _runtime(ctx)
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
    from mlops_gpu.cli.team import audit, server, users
    from mlops_gpu.cli.top import top

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
