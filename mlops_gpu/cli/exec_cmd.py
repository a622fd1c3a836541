"""``mlops-gpu exec -- CMD``: the launcher each backend runs inside a job
(``telemetry.launcher``)."""

from __future__ import annotations

import sys

import click


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.option("--run-id", default=None, help="MLflow run to log to (default: $MLFLOW_RUN_ID).")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds between GPU samples.",
)
@click.option(
    "--idle-after",
    "idle_after",
    type=click.FloatRange(min=0),
    default=1800.0,
    show_default=True,
    help="Seconds with every GPU under --idle-below before the run is flagged idle.",
)
@click.option(
    "--idle-below",
    type=click.FloatRange(min=0, max=100),
    default=1.0,
    show_default=True,
    help="Utilization (percent) under which a GPU counts as idle.",
)
@click.option("--stop-idle", is_flag=True, help="Stop (SIGTERM) a run flagged idle.")
@click.option(
    "--telemetry-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Keep a JSON summary (mean utilization, idle time) here for the scheduler.",
)
@click.option(
    "--term-signal",
    default=None,
    help="Pass a SIGTERM on to COMMAND as this signal (e.g. USR1: its checkpoint signal).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(
    run_id: str | None,
    interval: float,
    idle_after: float,
    idle_below: float,
    stop_idle: bool,
    telemetry_file: str | None,
    term_signal: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (after --), sample its GPUs (CUDA_VISIBLE_DEVICES) into its MLflow run
    ($MLFLOW_TRACKING_URI), forward signals to it, and exit with its status."""
    from mlops_gpu.telemetry.launcher import main as launch
    from mlops_gpu.telemetry.launcher import signal_number

    if term_signal is not None:
        try:
            signal_number(term_signal)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--term-signal") from None
    cmd = list(command)
    sys.exit(launch(cmd, run_id, interval, idle_after, stop_idle, idle_below, telemetry_file,
                    term_signal))  # fmt: skip
