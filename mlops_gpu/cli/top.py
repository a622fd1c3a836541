"""``mlops-gpu top``: a terminal view of the cluster, refreshed every second (rich ``Live``).

One frame: a header (GPUs by state, runs, the scheduler), the GPU heatmap (a row per node, a
cell per GPU: its utilization in percent, coloured, where a running run's launcher sampled it;
``██`` allocated without a sample, ``··`` free, ``xx`` cordoned), the head of the queue with
each run's reason, and per-project usage against quota. ``--once`` prints one frame (and
``--json`` its data: ``controller.top_data``). Locally it reads the store of the config it
is given; with ``MLOPS_GPU_URL`` (or after ``login``) it reads the same data from the server's
``/api/v1/top`` and draws it the same way, opening no store.

Invariants:
- Every user string (run, project, node names, reasons) is shown literally (``safe_text``):
  never parsed as markup, control and bidi characters escaped, long values cut.
- A frame reads the queue's head only (``observed.pending_head``), never the whole queue.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from mlops_gpu.cli.safe_text import REASON_LIMIT, cell, visible

#: GPU cells shown per node row before "+N"; nodes shown before "... N more nodes".
CELLS_PER_ROW = 64
FREE, CORDONED, HELD = "··", "xx", "██"


def _util_style(pct: float) -> str:
    if pct < 25:
        return "black on red"
    if pct < 50:
        return "black on yellow"
    if pct < 75:
        return "black on green"
    return "black on bright_green"


def _by_node(gpus: list[dict[str, Any]]) -> list[tuple[tuple[str, str], list[dict[str, Any]]]]:
    """((node, gpu_type), its GPUs) in the order the frame lists them."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for g in gpus:
        out.setdefault((g["node"], g["gpu_type"]), []).append(g)
    return list(out.items())


def _heatmap(data: dict[str, Any], max_nodes: int) -> Any:
    from rich.table import Table
    from rich.text import Text

    t = Table(title="GPUs (utilization %)", title_justify="left", show_header=True, box=None)
    t.add_column("NODE", no_wrap=True, overflow="fold")
    t.add_column("TYPE", no_wrap=True)
    t.add_column("GPUS", overflow="fold")
    for (node, gpu_type), devs in _by_node(data["gpus"])[:max_nodes]:
        line = Text()
        for i, g in enumerate(devs[:CELLS_PER_ROW]):
            state, pct = g["state"], g["utilization_pct"]
            if i:
                line.append(" ")
            if state == "allocated" and pct is not None:
                line.append(f"{min(round(pct), 99):02d}", style=_util_style(pct))
            elif state == "allocated":
                line.append(HELD, style="blue")
            elif state == "cordoned":
                line.append(CORDONED, style="red")
            else:
                line.append(FREE, style="dim")
        if len(devs) > CELLS_PER_ROW:
            line.append(f" +{len(devs) - CELLS_PER_ROW}")
        t.add_row(cell(node, 40), cell(gpu_type, 40), line)
    if data["nodes_total"] > max_nodes:
        t.caption = f"... {data['nodes_total'] - max_nodes} more nodes (--nodes N shows more)"
        t.caption_justify = "left"
    return t


def _queue(head: list[dict[str, Any]], total: int, now: float) -> Any:
    """The queue's head, compact enough for an 80-column terminal: the reason wraps (never
    hidden), the other columns keep their width."""
    from rich import box
    from rich.table import Table

    from mlops_gpu.cli.render import ago

    t = Table(title=f"Queue: {total} pending (head)", title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False)  # fmt: skip
    t.add_column("ID", no_wrap=True)
    t.add_column("NAME", overflow="fold", min_width=8, max_width=40)
    t.add_column("PROJECT", overflow="fold", max_width=24)
    t.add_column("CLASS", overflow="fold", max_width=12)
    t.add_column("CODE", no_wrap=True)
    t.add_column("REASON", overflow="fold", min_width=20, ratio=1)
    t.add_column("ETA", no_wrap=True)
    for r in head:
        e = r["eta"]
        eta = "-" if e is None else "now" if e <= now else "in " + ago(now, e)
        t.add_row(
            cell(r["id"]),
            cell(r["name"], 80),
            cell(r["project"], 80),
            cell(r["priority"], 80),
            cell(r["reason_code"] or "-", 40),
            cell(r["reason"] or "-", REASON_LIMIT),
            cell(eta),
        )
    return t  # fmt: skip


def _header(data: dict[str, Any]) -> Any:
    from rich.text import Text

    c = data["counts"]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data["now"]))
    return Text(
        f"mlops-gpu top  {when}  GPUs {sum(c.values())}: {c['allocated']} allocated, "
        f"{c['free']} free, {c['cordoned']} cordoned  runs: {data['holding']} "
        f"holding GPUs, {data['pending']} pending  scheduler: {visible(data['scheduler'])}"
    )


def draw(data: dict[str, Any], max_nodes: int) -> Any:
    """One frame (``controller.top_data``'s data, read locally or from a server) as a rich
    renderable."""
    from rich.console import Group

    from mlops_gpu.cli.render import table
    from mlops_gpu.controller.top_data import PROJECT_KEYS

    pcols = ("PROJECT", "USED/NOMINAL", "BORROWED", "RUNNING", "PENDING", "FAIR SHARE", "BUDGET")
    prows = [[p[k] for k in PROJECT_KEYS] for p in data["projects"]]
    return Group(
        _header(data),
        _heatmap(data, max_nodes),
        _queue(data["queue"], data["pending"], data["now"]),
        table("Projects", pcols, prows),
    )


def frame(rt: Any, reader: Any, *, max_nodes: int, queue_rows: int) -> tuple[Any, dict[str, Any]]:
    """(one local frame as a rich renderable, its data for ``--json``: every GPU)."""
    from mlops_gpu.controller.top_data import frame_data

    data = frame_data(rt, reader, queue_rows=queue_rows)
    return draw(data, max_nodes), data


def _source(ctx: click.Context, max_nodes: int, queue_rows: int) -> Any:
    """A function giving (frame, data): from the server with ``MLOPS_GPU_URL`` or ``login``
    (no store opened), else from the config's store."""
    from mlops_gpu.cli import remote_cmds as remote

    target = remote.remote_target(ctx)
    if target is not None:
        c = remote.client(target)

        def from_server() -> tuple[Any, dict[str, Any]]:
            data = c.top(queue_rows, max_nodes)
            return draw(data, max_nodes), data

        return from_server
    from mlops_gpu.cli.common import open_runtime
    from mlops_gpu.controller.cluster_view import ClusterReader

    rt = open_runtime(ctx)
    reader = ClusterReader(rt)
    return lambda: frame(rt, reader, max_nodes=max_nodes, queue_rows=queue_rows)


@click.command()
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: the frame's data as JSON.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="Seconds between refreshes.")  # fmt: skip
@click.option("--nodes", "max_nodes", type=click.IntRange(min=1), default=32, show_default=True,
              help="Nodes shown in the heatmap.")  # fmt: skip
@click.option("--queue", "queue_rows", type=click.IntRange(min=0), default=10, show_default=True,
              help="Pending runs shown (the head of the queue).")  # fmt: skip
@click.pass_context
def top(ctx: click.Context, once: bool, as_json: bool, interval: float, max_nodes: int,
        queue_rows: int) -> None:  # fmt: skip
    """A live view: the GPU heatmap, the queue's head with reasons, usage against quota.
    Against a server (``MLOPS_GPU_URL`` or ``login``) it reads everything through the API."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.cli.render import console
    from mlops_gpu.remote import RemoteError

    if as_json and not once:
        raise UserError("--json needs --once")
    source = _source(ctx, max_nodes, queue_rows)
    if once:
        try:
            group, data = source()
        except RemoteError as e:
            raise UserError(str(e)) from None
        if as_json:
            click.echo(json.dumps(data, indent=2))
        else:
            console().print(group)
        return
    from rich.live import Live

    con = console()
    try:
        with Live(console=con, screen=True, auto_refresh=False) as live:
            while True:
                try:
                    group, _ = source()
                except Exception as e:  # a store or server busy or gone for a moment: said,
                    group = cell(f"mlops-gpu top: cannot read the cluster now: {e}", 500)
                live.update(group, refresh=True)  # retried
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
