"""``mlops-gpu top``: a terminal view of the cluster, refreshed every second (rich ``Live``).

One frame: a header (GPUs by state, runs, the scheduler), the GPU heatmap (a row per node, a
cell per GPU: its utilization in percent, coloured, where a running run's launcher sampled it;
``██`` allocated without a sample, ``··`` free, ``xx`` cordoned), the head of the queue with
each run's reason, and per-project usage against quota. ``--once`` prints one frame (and
``--json`` its data). Local mode only: it reads the store of the config it is given.

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


def _cells(view: Any) -> list[tuple[Any, list[tuple[str, str, str, float | None]]]]:
    """(node, [(device, state, run id, utilization percent)]) in inventory order."""
    util = {(s.node, s.device): s.utilization_pct for s in view.obs.samples}
    out = []
    for n in view.nodes:
        row = []
        for d in view.node_devices(n):
            state = view.gpu_state(n, d)
            row.append((d, state, view.holder.get((n.name, d), ""), util.get((n.name, d))))
        out.append((n, row))
    return out


def _heatmap(view: Any, max_nodes: int) -> Any:
    from rich.table import Table
    from rich.text import Text

    t = Table(title="GPUs (utilization %)", title_justify="left", show_header=True, box=None)
    t.add_column("NODE", no_wrap=True, overflow="fold")
    t.add_column("TYPE", no_wrap=True)
    t.add_column("GPUS", overflow="fold")
    rows = _cells(view)
    for node, devs in rows[:max_nodes]:
        line = Text()
        for i, (_d, state, _run, pct) in enumerate(devs[:CELLS_PER_ROW]):
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
        t.add_row(cell(node.name, 40), cell(node.gpu_type, 40), line)
    if len(rows) > max_nodes:
        t.caption = f"... {len(rows) - max_nodes} more nodes (--nodes N shows more)"
        t.caption_justify = "left"
    return t


def _queue(head: list[Any], total: int, now: float) -> Any:
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
        eta = "-" if r.eta is None else "now" if r.eta <= now else "in " + ago(now, r.eta)
        t.add_row(
            cell(r.id),
            cell(r.name, 80),
            cell(r.project, 80),
            cell(r.priority, 80),
            cell(r.reason_code or "-", 40),
            cell(r.reason or "-", REASON_LIMIT),
            cell(eta),
        )
    return t  # fmt: skip


def _project_rows(view: Any) -> list[list[object]]:
    pending, running = view.pending_by_project(), view.running_by_project()
    names = sorted(set(view.projects) | set(pending) | set(running))
    types = sorted({t for (_p, t) in view.used} | set(view.gpu_types))
    rows: list[list[object]] = []
    for p in names:
        proj = view.projects.get(p)
        quota = []
        borrowed = 0.0
        for t in types:
            u = view.used.get((p, t), 0.0)
            nom = proj.quota(t).nominal if proj is not None else 0
            if u or nom:
                quota.append(f"{u:g}/{nom} {t}")
            borrowed += max(u - nom, 0.0)
        budget = view.budget_ratio.get(p)
        rows.append([p, ", ".join(quota) or "-", f"{borrowed:g}", running.get(p, 0),
                     pending.get(p, 0), f"{view.fair_share.get(p, 0.0):.3f}",
                     "-" if budget is None else f"{100 * budget:.0f}%"])  # fmt: skip
    return rows


def _header(view: Any, sched: str) -> Any:
    from rich.text import Text

    counts = {"allocated": 0, "free": 0, "cordoned": 0}
    for _n, devs in _cells(view):
        for _d, state, _r, _u in devs:
            counts[state] += 1
    pending = sum(view.obs.pending.values())
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(view.now))
    return Text(
        f"mlops-gpu top  {when}  GPUs {sum(counts.values())}: {counts['allocated']} allocated, "
        f"{counts['free']} free, {counts['cordoned']} cordoned  runs: {len(view.obs.active)} "
        f"holding GPUs, {pending} pending  scheduler: {visible(sched)}"
    )


def _scheduler(rt: Any) -> str:
    from mlops_gpu.state import heartbeat as hb

    info = hb.read(rt.store)
    if not hb.is_running(info):
        return "not running"
    assert info is not None
    return f"running (pid {info.pid} on {info.host})"


def frame(rt: Any, reader: Any, *, max_nodes: int, queue_rows: int) -> tuple[Any, dict[str, Any]]:
    """(one frame as a rich renderable, its data for ``--json``)."""
    from rich.console import Group

    from mlops_gpu.cli.render import table
    from mlops_gpu.state import observed

    view = reader.view()
    head = observed.pending_head(rt.store, queue_rows, view.priority_classes)
    total = sum(view.obs.pending.values())
    prows = _project_rows(view)
    pcols = ("PROJECT", "USED/NOMINAL", "BORROWED", "RUNNING", "PENDING", "FAIR SHARE", "BUDGET")
    group = Group(
        _header(view, _scheduler(rt)),
        _heatmap(view, max_nodes),
        _queue(head, total, view.now),
        table("Projects", pcols, prows),
    )
    data = {
        "gpus": [
            {
                "node": n.name,
                "gpu_type": n.gpu_type,
                "gpu": d,
                "state": s,
                "run": r or None,
                "utilization_pct": u,
            }
            for n, devs in _cells(view)
            for d, s, r, u in devs
        ],
        "queue": [
            {
                "id": r.id,
                "name": r.name,
                "project": r.project,
                "priority": r.priority,
                "reason_code": r.reason_code,
                "reason": r.reason,
            }
            for r in head
        ],
        "pending": total,
        "projects": [
            dict(
                zip(
                    ("project", "quota", "borrowed", "running", "pending", "fair_share", "budget"),
                    row,
                    strict=True,
                )
            )
            for row in prows
        ],
    }
    return group, data


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
    """A live view: the GPU heatmap, the queue's head with reasons, usage against quota."""
    from mlops_gpu.cli.main import UserError, _runtime
    from mlops_gpu.cli.render import console
    from mlops_gpu.controller.cluster_view import ClusterReader

    if as_json and not once:
        raise UserError("--json needs --once")
    rt = _runtime(ctx)
    reader = ClusterReader(rt)
    if once:
        group, data = frame(rt, reader, max_nodes=max_nodes, queue_rows=queue_rows)
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
                    group, _ = frame(rt, reader, max_nodes=max_nodes, queue_rows=queue_rows)
                except Exception as e:  # a store busy or gone for a moment: said, retried
                    group = cell(f"mlops-gpu top: cannot read the store now: {e}", 500)
                live.update(group, refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
