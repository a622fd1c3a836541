"""Human output of the read verbs (rich tables); ``--json`` output lives beside each verb."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mlops_gpu.model import Node, Run
from mlops_gpu.model.public import run_to_public


def ago(t: float | None, now: float | None = None) -> str:
    if t is None:
        return "-"
    s = int((now or time.time()) - t)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(s) >= n:
            return f"{s // n}{unit}"
    return f"{s}s"


def console() -> Any:
    """A rich console; when not on a terminal, wide enough that tables are not truncated."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=200)


def _gpus(run: Run) -> str:
    req = run.spec.request
    types = "|".join(req.gpu_types) or "(any type)"
    if run.placement is not None:
        types = run.placement.gpu_type
    shape = f"{req.gpus}" if req.nodes == 1 else f"{req.nodes}x{req.gpus}"
    return f"{shape} {types}"


def runs_table(runs: Sequence[Run], *, title: str, with_reason: bool) -> None:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("ID", "NAME", "PROJECT", "PRIORITY", "PHASE", "GPUS", "WHERE", "AGE"):
        t.add_column(col, no_wrap=col != "NAME")
    if with_reason:
        t.add_column("REASON")
        t.add_column("ETA")
    now = time.time()
    for r in runs:
        pub = run_to_public(r)
        where = ",".join(pub["node_names"])
        if pub["devices"]:
            where += f" [{','.join(pub['devices'])}]"
        row = [
            r.id,
            r.spec.name,
            r.project,
            r.spec.priority,
            r.phase.value,
            _gpus(r),
            where or "-",
            ago(r.submitted_at, now),
        ]
        if with_reason:
            row += [r.reason or "-", pub["eta"] or "-"]
        t.add_row(*row)
    console().print(t)
    if not runs:
        print("(none)")


def nodes_table(nodes: Sequence[Node], free: dict[str, int], holders: dict[str, list[str]]) -> None:
    from rich.table import Table

    t = Table(title="Nodes", title_justify="left")
    for col in ("NODE", "BACKEND", "GPU TYPE", "GPUS", "FREE", "STATE", "RUNS"):
        t.add_column(col)
    for n in nodes:
        state = "ready" if n.schedulable else f"unschedulable {n.state_reason}".strip()
        t.add_row(
            n.name,
            n.backend,
            n.gpu_type,
            str(n.capacity),
            str(free[n.name]),
            state,
            ",".join(holders.get(n.name, [])) or "-",
        )
    console().print(t)


def events_table(run_id: str, events: Sequence[Any]) -> None:
    from rich.table import Table

    from mlops_gpu.model.public import iso

    t = Table(title=f"Events of {run_id}", title_justify="left")
    for col in ("TIME (UTC)", "ATTEMPT", "EVENT", "PHASE", "REASON", "LOST GPU-S"):
        t.add_column(col)
    for e in events:
        phase = f"{e.phase_from or ''} -> {e.phase_to}" if e.phase_to else "-"
        lost = "-" if e.lost_gpu_s is None else f"{e.lost_gpu_s:.0f}"  # (preemptions only)
        t.add_row(iso(e.time) or "-", str(e.attempt), e.kind, phase, e.reason, lost)
    console().print(t)
