"""Job control and accounting verbs as Slurm users know them: ``update`` (``scontrol update``)
and ``history`` (``sacct``), plus the ``--user``/``--mine`` filter that ``queue``, ``status``
and ``history`` share. Local mode reads and writes the store through the controller's views;
remote mode (``cli.remote_cmds``) asks the server, where ``--mine`` is the token's user.

Output: tables through ``cli.render`` (every value shown literally by ``safe_text``), or
``--json`` / ``--csv`` with the keys of ``controller.history.HISTORY_KEYS``.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any

import click

from mlops_gpu.cli import remote_cmds as remote
from mlops_gpu.cli.common import (  # (re-exported: the verbs' shared helpers were here)
    UserError,
    array_lines,
    local_me,
    user_options,
    whose,
)
from mlops_gpu.cli.parse import parse_duration


def _error(msg: str) -> click.ClickException:
    return UserError(msg)


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: an age (``90m``, ``2h``, ``7d``) or an ISO time (UTC unless it says)."""
    try:
        return (time.time() if now is None else now) - parse_duration(text, "--since")
    except click.BadParameter:
        pass
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise _error(f"--since: expected an age such as 2h or 7d, or an ISO time such as "
                     f"2026-01-31T12:00, got {text!r}") from None  # fmt: skip
    return (t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)).timestamp()


@click.command()
@click.argument("run_id")
@click.option("--priority", default=None, help="New priority class.")
@click.option("--max-runtime", default=None, help="New max runtime, e.g. 2h (running: shorter).")
@click.option("--gpus", "-g", type=int, default=None, help="New GPUs per node (pending only).")
@click.option("--gpu-type", "-t", "gpu_types", multiple=True,
              help="New acceptable GPU type; repeat for several (pending only).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@click.pass_context
def update(
    ctx: click.Context,
    run_id: str,
    priority: str | None,
    max_runtime: str | None,
    gpus: int | None,
    gpu_types: tuple[str, ...],
    as_json: bool,
) -> None:
    """Change a pending run's priority, max runtime, GPUs or GPU type (a running one: its
    priority, or a shorter max runtime). Each change is an event (status ID --events)."""
    from mlops_gpu.model.public import run_to_public

    try:
        runtime_s = parse_duration(max_runtime, "--max-runtime") if max_runtime else None
    except click.BadParameter as e:
        raise _error(e.format_message()) from None
    changes: dict[str, Any] = {"priority": priority, "max_runtime_s": runtime_s, "gpus": gpus,
                               "gpu_types": list(gpu_types) or None}  # fmt: skip
    if (target := remote.remote_target(ctx)) is not None:
        remote.update(target, run_id, changes, as_json)
        return
    from mlops_gpu.cli.common import ids_of, open_runtime
    from mlops_gpu.controller.update import UpdateError, update_array, update_run

    rt = open_runtime(ctx)
    types = changes.pop("gpu_types")
    changes["gpu_types"] = tuple(types) if types else None
    try:
        if rt.store.get(run_id) is None:  # an array id: its pending elements, a line each
            done = update_array(rt, ids_of(rt, run_id), **changes)
            for line in array_lines(
                [run_to_public(r) for r, _ in done], {r.id: what for r, what in done}, as_json
            ):
                click.echo(line)
            return
        run, what = update_run(rt, run_id, **changes)
    except UpdateError as e:
        raise _error(str(e)) from None
    click.echo(json.dumps(run_to_public(run)) if as_json else f"{run_id}: {what}")


@click.command()
@click.option("--since", "-S", default="1d", show_default=True,
              help="Runs that ended since: an age (2h, 7d) or an ISO time (UTC).")  # fmt: skip
@click.option("--project", "-p", default=None, help="Only this project.")
@user_options
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Newest runs shown.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the runs as a JSON list.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the runs as CSV (a header row first).")
@click.pass_context
def history(
    ctx: click.Context,
    since: str,
    project: str | None,
    user: str | None,
    mine: bool,
    limit: int,
    as_json: bool,
    as_csv: bool,
) -> None:
    """Finished runs, newest end first (like sacct): submit, start, end, elapsed, GPU-hours,
    cost, exit code, attempts and the work preemptions lost."""
    if as_json and as_csv:
        raise _error("--json and --csv: give one of them, not both")
    start = parse_since(since)
    if (target := remote.remote_target(ctx)) is not None:
        rows = remote.history(target, start, project, user, mine, limit)
    else:
        from mlops_gpu.cli.common import open_runtime
        from mlops_gpu.controller.history import history_rows

        rt = open_runtime(ctx)
        who = whose(user, mine, local_me)
        rows = history_rows(rt, since=start, projects=[project] if project else None, user=who,
                            limit=limit)  # fmt: skip
    show_history(rows, as_json, as_csv, start)


def show_history(rows: list[dict[str, Any]], as_json: bool, as_csv: bool, since: float) -> None:
    from mlops_gpu.cli.render import console, table
    from mlops_gpu.controller.history import HISTORY_KEYS
    from mlops_gpu.model.public import iso

    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if as_csv:
        w = csv.DictWriter(sys.stdout, fieldnames=HISTORY_KEYS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return
    cols = ("ID", "NAME", "PROJECT", "USER", "STATE", "GPUS", "SUBMIT", "START", "END",
            "ELAPSED", "GPU-H", "COST", "EXIT", "ATT", "LOST GPU-H")  # fmt: skip
    out = [[r["id"], r["name"], r["project"], r["user"], r["phase"], _gpus(r),
            _t(r["submitted_at"]), _t(r["started_at"]), _t(r["finished_at"]),
            _elapsed(r["elapsed_s"]), f"{r['gpu_hours']:.3f}", f"{r['cost_usd']:.2f}",
            "-" if r["exit_code"] is None else r["exit_code"], r["attempts"],
            f"{r['lost_gpu_hours']:.3f}"] for r in rows]  # fmt: skip
    title = f"History: {len(rows)} finished since {_t(iso(since))} UTC"
    # the long free-text columns fold, cut at their limits; the others keep one line
    console().print(table(title, cols, out, wrap=tuple(_LIMITS), limits=_LIMITS))
    if not rows:
        print("(none)")


_LIMITS = {"NAME": 60, "PROJECT": 40, "USER": 40, "GPUS": 40}


def _gpus(r: dict[str, Any]) -> str:
    shape = f"{r['gpus']}" if r["num_nodes"] == 1 else f"{r['num_nodes']}x{r['gpus']}"
    return f"{shape} {r['gpu_type'] or ''}".strip()


def _t(iso_time: str | None) -> str:
    return "-" if iso_time is None else iso_time[:19]


def _elapsed(s: float | None) -> str:
    """Like sacct: [D-]HH:MM:SS."""
    if s is None:
        return "-"
    n = round(s)
    d, n = divmod(n, 86400)
    return (f"{d}-" if d else "") + f"{n // 3600:02d}:{n % 3600 // 60:02d}:{n % 60:02d}"
