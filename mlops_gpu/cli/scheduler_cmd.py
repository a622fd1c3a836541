"""``mlops-gpu scheduler [run|status|stop|restart]``.

``scheduler`` alone (or ``scheduler run``) runs the control loop in the foreground, as it always
has. ``status`` reads what the running scheduler publishes in the store (``state.heartbeat``),
so it takes no lock and works from any process that can open the store; ``stop`` sends the
scheduler SIGTERM and waits until it has exited (it finishes its tick, releases the leader lock;
runs keep running and the next scheduler picks them up); ``restart`` stops it and starts one in
the background the way ``submit`` does (logging to ``STATE/scheduler.log``).

Exit status of ``status``: 0 when a scheduler runs, 3 when none does (as ``systemctl status``).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import click

NO_SCHEDULER = (
    "no scheduler is running: runs will wait; start one with `mlops-gpu scheduler` "
    "(or submit without --no-start)"
)
#: ``scheduler status`` exits with this when no scheduler runs.
NOT_RUNNING = 3


def _run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(
        [
            click.option("--once", is_flag=True, help="Reconcile, run one tick and exit."),
            click.option(
                "--idle-exit",
                type=float,
                default=None,
                help="Exit after this many seconds with nothing pending or running.",
            ),
            click.option("--quiet-if-running", is_flag=True, hidden=True),
            click.option("--verbose", "-v", is_flag=True, help="Log every event."),
        ]
    ):
        f = opt(f)
    return f


@click.group(name="scheduler", invoke_without_command=True)
@_run_options
@click.pass_context
def scheduler(
    ctx: click.Context, once: bool, idle_exit: float | None, quiet_if_running: bool, verbose: bool
) -> None:
    """Run the scheduling loop in the foreground (the daemon); `scheduler status|stop|restart`
    to see or control the one that runs."""
    from mlops_gpu.cli.common import UserError

    if ctx.invoked_subcommand is not None:
        if once or idle_exit is not None or quiet_if_running or verbose:
            raise UserError(
                "--once, --idle-exit and --verbose go with `scheduler` or `scheduler run`, "
                f"not with `scheduler {ctx.invoked_subcommand}`"
            )
        return
    _foreground(ctx, once, idle_exit, quiet_if_running, verbose)


@scheduler.command(name="run")
@_run_options
@click.pass_context
def run_(
    ctx: click.Context, once: bool, idle_exit: float | None, quiet_if_running: bool, verbose: bool
) -> None:
    """Run the scheduling loop in the foreground (same as `scheduler` alone)."""
    _foreground(ctx, once, idle_exit, quiet_if_running, verbose)


def _foreground(
    ctx: click.Context, once: bool, idle_exit: float | None, quiet_if_running: bool, verbose: bool
) -> None:
    from mlops_gpu.cli.common import open_runtime
    from mlops_gpu.cli.daemon import run_scheduler

    rt = open_runtime(ctx)
    sys.exit(run_scheduler(rt, once=once, idle_exit=idle_exit,
                           quiet_if_running=quiet_if_running, verbose=verbose))  # fmt: skip


@scheduler.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as a JSON object.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """The scheduler running for this store: pid, uptime, last tick, engine, config version."""
    import json

    from mlops_gpu.cli.common import open_runtime
    from mlops_gpu.config.pools import not_acted_on

    rt = open_runtime(ctx)
    out = status_dict(rt)
    # configured pools that nothing scales (backends without power control)
    out["pools_note"] = not_acted_on(rt.cfg.pools, rt.cfg.backends)
    if as_json:
        click.echo(json.dumps(out, indent=2))
    else:
        for line in _status_lines(out):
            click.echo(line)
        if out["pools_note"]:
            click.echo(out["pools_note"])
    sys.exit(0 if out["running"] else NOT_RUNNING)


@scheduler.command()
@click.option("--timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for it to exit.")  # fmt: skip
@click.pass_context
def stop(ctx: click.Context, timeout: float) -> None:
    """Stop the running scheduler gracefully (SIGTERM; it ends its tick) and wait for it."""
    from mlops_gpu.cli.common import open_runtime

    rt = open_runtime(ctx)
    pid = _stop(rt, timeout)
    if pid is None:
        click.echo(f"no scheduler is running for {_store(rt)}")
    else:
        click.echo(f"scheduler pid {pid} stopped (runs keep running; the next start adopts them)")


@scheduler.command()
@click.option("--timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for the old one to exit and the new one to start.")  # fmt: skip
@click.option("--idle-exit", type=float, default=None,
              help="The new one exits after this long idle (default: as the old one; the "
                   "config's scheduler.idle_exit_s when none ran).")  # fmt: skip
@click.pass_context
def restart(ctx: click.Context, timeout: float, idle_exit: float | None) -> None:
    """Stop the running scheduler (if any) and start one in the background."""
    from mlops_gpu.cli.common import UserError, open_runtime
    from mlops_gpu.controller.daemon import start_background
    from mlops_gpu.state import heartbeat as hb

    rt = open_runtime(ctx)
    before = hb.read(rt.store)
    was_running = hb.is_running(before)
    old = _stop(rt, timeout)
    if idle_exit is None:
        idle_exit = (
            before.idle_exit_s
            if was_running and before is not None
            else rt.cfg.scheduler.idle_exit_s
        )
    pid = start_background(rt, idle_exit)
    deadline = time.monotonic() + max(timeout, 5.0)
    while time.monotonic() < deadline:
        info = hb.read(rt.store)
        if info is not None and info.pid == pid and hb.is_running(info):
            break
        if not hb.pid_alive(pid):
            raise UserError(f"the new scheduler (pid {pid}) exited at once; see "
                            f"{rt.cfg.state_path / 'scheduler.log'}")  # fmt: skip
        time.sleep(0.1)
    else:
        raise UserError(f"the new scheduler (pid {pid}) did not report within {timeout:g}s; "
                        f"see {rt.cfg.state_path / 'scheduler.log'}")  # fmt: skip
    was = f" (was pid {old})" if old is not None else ""
    idle = f", exits after {idle_exit:g}s idle" if idle_exit is not None else ""
    click.echo(f"scheduler restarted: pid {pid}{was}{idle}; log: "
               f"{rt.cfg.state_path / 'scheduler.log'}")  # fmt: skip


def _stop(rt: Any, timeout: float) -> int | None:
    """SIGTERM to the running scheduler, then wait until it exits; its pid (None: none ran)."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.state import heartbeat as hb

    info = hb.read(rt.store)
    if info is None or not hb.is_running(info):
        return None
    if info.host != socket.gethostname():
        raise UserError(f"the scheduler for {_store(rt)} runs on host {info.host} "
                        f"(pid {info.pid}): stop it there")  # fmt: skip
    try:
        os.kill(info.pid, signal.SIGTERM)
    except ProcessLookupError:
        return info.pid
    except PermissionError:
        raise UserError(f"cannot signal the scheduler (pid {info.pid}): "
                        "it runs as another user") from None  # fmt: skip
    deadline = time.monotonic() + timeout
    while hb.pid_alive(info.pid):
        if time.monotonic() >= deadline:
            raise click.ClickException(
                f"the scheduler (pid {info.pid}) is still running {timeout:g}s after SIGTERM "
                f"(a tick may be blocked: see {rt.cfg.state_path / 'scheduler.log'}); wait and "
                f"retry, or `kill -9 {info.pid}` (runs keep running; the next start adopts them)"
            )
        time.sleep(0.05)
    return info.pid


def _store(rt: Any) -> str:
    """The store URL without its password."""
    from mlops_gpu.controller.views import store_display

    return store_display(rt)


def status_dict(rt: Any) -> dict[str, Any]:
    """``scheduler status --json`` (``controller.views.scheduler_status``)."""
    from mlops_gpu.controller.views import scheduler_status

    return scheduler_status(rt)


def _status_lines(s: dict[str, Any]) -> list[str]:
    from mlops_gpu.cli.render import ago

    if "pid" not in s:
        return [f"scheduler: not running for {s['store']} (none has run)", NO_SCHEDULER]
    if not s["running"]:
        when = ago(s["stopped_at"]) + " ago" if s["stopped_at"] else "without stopping cleanly"
        return [f"scheduler: not running for {s['store']} (pid {s['pid']} on {s['host']} "
                f"ended {when})", NO_SCHEDULER]  # fmt: skip
    c = s["config"]
    stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(c["mtime"])) if c["mtime"] else "-"
    tick = f"{s['last_tick_age_s']:.1f}s ago ({s['ticks']} ticks)" if s["last_tick_at"] else "-"
    lines = [
        f"scheduler: running, pid {s['pid']} on {s['host']}, up {ago(s['started_at'])}",
        f"store:     {s['store']}",
        f"last tick: {tick}",
        f"engine:    {s['engine'] or '-'}",
        f"config:    {c['path'] or '-'} (sha256 {(c['sha256'] or '-')[:12]}, modified {stamp}, "
        f"loaded {ago(c['loaded_at'])} ago)",
    ]
    if c["error"]:
        lines.append(f"           latest edit refused, the loaded version runs: {c['error']}")
    elif c["file_changed"]:
        lines.append("           the file changed since: it is loaded at the next tick")
    if c["restart_needed"]:
        lines.append(f"           {', '.join(c['restart_needed'])} changed: applied at "
                     "`mlops-gpu scheduler restart`")  # fmt: skip
    idle = f"after {s['idle_exit_s']:g}s with nothing to do" if s["idle_exit_s"] else "never"
    lines.append(f"idle exit: {idle}")
    return lines


def warn_if_none(rt: Any) -> None:
    """``queue`` and ``status``: one line on stderr when no scheduler runs for this store."""
    from mlops_gpu.state import heartbeat as hb

    try:
        running = hb.is_running(hb.read(rt.store))
    except Exception:  # a view must not fail on this hint
        return
    if not running:
        click.echo(f"mlops-gpu: {NO_SCHEDULER}", err=True)
