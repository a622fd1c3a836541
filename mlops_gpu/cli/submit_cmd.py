"""``mlops-gpu submit`` (with Slurm-like job control: ``--array``, ``--after...``, ``--hold``,
``--begin``), ``hold`` and ``release``. Job control's formats: ``controller.jobs``.
"""

from __future__ import annotations

import json
from typing import Any

import click

from mlops_gpu.cli import remote_cmds as remote
from mlops_gpu.cli.parse import parse_duration, parse_env
from mlops_gpu.model.submit import SubmitFieldError, SubmitRequest, signal_name

_IDS = "ID[,ID]"


def job_options(f: Any) -> Any:
    """The job control options of ``submit`` (they reach it as ``**job``)."""
    opts = [
        click.option("--array", default=None, metavar="SPEC",
                     help="A job array: 0-99, 1,3,5, 0-99:2, with %N for at most N running "
                     "(each element gets MLOPS_GPU_ARRAY_INDEX)."),
        click.option("--after", multiple=True, metavar=_IDS,
                     help="Start after these runs (or arrays) end, however they end."),
        click.option("--afterok", multiple=True, metavar=_IDS,
                     help="Start after these succeed (cancelled if one fails or is cancelled)."),
        click.option("--afternotok", multiple=True, metavar=_IDS,
                     help="Start after these fail or are cancelled (cancelled if one succeeds)."),
        click.option("--afterany", multiple=True, metavar=_IDS, help="Same as --after."),
        click.option("--after-name", "after_names", multiple=True, metavar="NAME",
                     help="Start after every earlier run of yours with this name has ended."),
        click.option("--hold", is_flag=True, help="Queue it held (until `release`)."),
        click.option("--begin", default=None, metavar="TIME",
                     help="Not before TIME: now+2h, now+30m, or an ISO time (local unless it "
                     "has an offset), e.g. 2026-12-02T15:00."),
    ]  # fmt: skip
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.command(context_settings={"ignore_unknown_options": False})
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
@job_options
@click.argument("command", nargs=-1, required=True)
@click.pass_context
def submit(
    ctx: click.Context,
    /,
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
    **job: Any,
) -> None:
    """Queue COMMAND (after --) as a run; prints the run id (an array's id with --array)."""
    from mlops_gpu.cli.common import UserError, open_runtime
    from mlops_gpu.controller import SubmitError
    from mlops_gpu.controller.jobs import JobRequest, ids_text, submit_job
    from mlops_gpu.model.public import run_to_public
    from mlops_gpu.model.text import spec_text_problems

    try:
        asked = submit_request(
            command, project=project, name=name, gpus=gpus, nodes=nodes, gpu_types=gpu_types,
            gpu_fraction=gpu_fraction, gpu_memory_mb=gpu_memory_mb, mig=mig,
            cpu_milli=cpu_milli, host_memory_mb=host_memory_mb, topology_key=topology_key,
            topology_required=topology_required, priority=priority, max_runtime=max_runtime,
            experiment=experiment, backend=backend, non_preemptible=non_preemptible,
            stop_signal=stop_signal, grace=grace, env=env, workdir=workdir,
            max_attempts=max_attempts,
        )  # fmt: skip
    except SubmitFieldError as e:
        raise UserError(f"--{e.field}: {e}") from None
    except click.BadParameter as e:
        raise UserError(e.format_message()) from None
    req = JobRequest(**job)
    if (target := remote.remote_target(ctx)) is not None:
        remote.submit(target, {"command": list(command), **asked.body(), **_job_body(req)},
                      as_json)  # fmt: skip
        return
    rt = open_runtime(ctx)
    spec = rt.spec_of(asked)
    try:
        # argv is checked by ArgsGroup; the working directory and user name are not argv
        if problems := spec_text_problems(spec):
            raise SubmitError("; ".join(problems))
        if req.empty:
            runs = [rt.submit(spec, start_scheduler=not no_start)]
        else:
            runs = submit_job(rt, spec, req, start_scheduler=not no_start)
    except SubmitError as e:
        raise UserError(str(e)) from None
    if not as_json:
        click.echo(ids_text(runs))
    elif req.array is None:
        click.echo(json.dumps(run_to_public(runs[0])))
    else:
        click.echo(json.dumps([run_to_public(r) for r in runs]))


def submit_request(
    command: tuple[str, ...],
    *,
    project: str,
    name: str | None = None,
    gpus: int = 1,
    nodes: int = 1,
    gpu_types: tuple[str, ...] = (),
    gpu_fraction: float | None = None,
    gpu_memory_mb: int | None = None,
    mig: str | None = None,
    cpu_milli: int = 0,
    host_memory_mb: int = 0,
    topology_key: str | None = None,
    topology_required: bool = False,
    priority: str | None = None,
    max_runtime: str | None = None,
    experiment: str | None = None,
    backend: str | None = None,
    non_preemptible: bool = False,
    stop_signal: str = "SIGTERM",
    grace: str = "30s",
    env: tuple[str, ...] = (),
    workdir: str | None = None,
    max_attempts: int | None = None,
) -> SubmitRequest:
    """``submit``'s flags (as click passes them: durations and ``KEY=VALUE`` pairs as text) as
    the one ``SubmitRequest`` every edge fills (``model.submit``). Raises ``click.BadParameter``
    for a bad duration or pair, ``SubmitFieldError`` for a bad signal."""
    signal_name(stop_signal)  # (checked first, as before the other flags)
    grace_s = 0.0 if grace.strip() in ("0", "0s") else parse_duration(grace, "--grace")
    return SubmitRequest(
        project=project, command=tuple(command), name=name, gpus=gpus, nodes=nodes,
        gpu_types=tuple(gpu_types), gpu_fraction=gpu_fraction, gpu_memory_mb=gpu_memory_mb,
        mig=mig, cpu_milli=cpu_milli, host_memory_mb=host_memory_mb,
        topology_key=topology_key, topology_required=topology_required, priority=priority,
        max_runtime_s=parse_duration(max_runtime, "--max-runtime") if max_runtime else None,
        experiment=experiment, backend=backend, preemptible=not non_preemptible,
        signal=stop_signal, grace_s=grace_s, env=parse_env(env), workdir=workdir,
        max_attempts=max_attempts,
    )  # fmt: skip


def _job_body(req: Any) -> dict[str, Any]:
    """The job control fields of an API submit (``controller.jobs.request_of``)."""
    out: dict[str, Any] = {}
    for key in ("array", "after", "afterok", "afternotok", "afterany", "hold", "begin"):
        v = getattr(req, key)
        if v:
            out[key] = list(v) if isinstance(v, tuple) else v
    if req.after_names:
        out["after_name"] = list(req.after_names)
    return out


def _hold_verb(held: bool) -> Any:
    verb = "hold" if held else "release"

    @click.command(name=verb)
    @click.argument("run_ids", nargs=-1, required=True)
    @click.pass_context
    def cmd(ctx: click.Context, run_ids: tuple[str, ...]) -> None:
        from mlops_gpu.cli.common import ids_of, open_runtime
        from mlops_gpu.state.jobs import set_held

        if (target := remote.remote_target(ctx)) is not None:
            remote.hold(target, run_ids, held)
            return
        rt = open_runtime(ctx)
        for rid in run_ids:
            ids = ids_of(rt, rid)
            done = set_held(rt.store, ids, held)
            if len(ids) == 1:
                click.echo(f"{rid}: {done[rid]}")
            else:
                n = sum(1 for what in done.values() if what in ("held", "released"))
                click.echo(f"{rid}: {n} of {len(ids)} elements {'held' if held else 'released'}")

    cmd.help = (
        "Hold pending runs (or every pending element of an array): they stay queued but do "
        "not start until released."
        if held
        else "Release held runs (or an array's held elements): they queue again."
    )
    return cmd


hold = _hold_verb(True)
release = _hold_verb(False)
