"""Human output of the read verbs (rich tables); ``--json`` output lives beside each verb.

Every value shown goes through ``safe_text.cell`` (a rich ``Text``, never markup, controls
escaped, long values cut; a caption says when one was): a run name such as ``[/bold]`` or
``ESC ]0;...`` is shown as typed, to every reader.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mlops_gpu.cli.safe_text import CELL_LIMIT, REASON_LIMIT, cell, was_cut
from mlops_gpu.model import Run
from mlops_gpu.model.public import run_to_public

_REASON = {"REASON": REASON_LIMIT}


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


def table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    wrap: Sequence[str] = (),
    limits: dict[str, int] | None = None,
) -> Any:
    """A rich table of ``rows`` (any values, shown literally by ``safe_text.cell``, cut at
    ``CELL_LIMIT`` characters or the column's ``limits``), with a caption when a value was cut.
    ``wrap``: the columns that wrap (when given, the others do not)."""
    from rich.table import Table

    lim = [(limits or {}).get(c, CELL_LIMIT) for c in columns]
    cut = any(was_cut(v, n) for row in rows for v, n in zip(row, lim, strict=True))
    caption = "values cut (…(+N chars)); --json shows them whole" if cut else None
    t = Table(title=cell(title), title_justify="left", caption=caption, caption_justify="left")
    for c in columns:
        # fold, not the default ellipsis: rich must not hide the end of a value (the cut note)
        t.add_column(c, no_wrap=bool(wrap) and c not in wrap, overflow="fold")
    for row in rows:
        t.add_row(*(cell(v, n) for v, n in zip(row, lim, strict=True)))
    return t


def _gpus(run: Run) -> str:
    req = run.spec.request
    types = "|".join(req.gpu_types) or "(any type)"
    if run.placement is not None:
        types = run.placement.gpu_type
    shape = f"{req.gpus}" if req.nodes == 1 else f"{req.nodes}x{req.gpus}"
    return f"{shape} {types}"


Row = tuple[dict[str, Any], str, float | None]  # (public run, GPUs shown, submit time)


def runs_table(runs: Sequence[Run], *, title: str, with_reason: bool, expand: bool = True) -> None:
    """``expand`` False: an array's elements fold into one line (``_fold``)."""
    rows = [(run_to_public(r), _gpus(r), r.submitted_at) for r in runs]
    _runs_rows(rows if expand else _fold(rows), title, with_reason)


def _fold(rows: Sequence[Row]) -> list[Row]:
    """One line per array where its first element would be: the array id, its elements'
    phases counted, the reason and ETA of its first pending element. Local and remote mode
    fold the same public rows, so they print the same lines."""
    from collections import Counter

    groups: dict[str, list[Row]] = {}
    order: list[Row | str] = []
    for row in rows:
        aid = row[0].get("array_id")
        if aid is None:
            order.append(row)
            continue
        if aid not in groups:
            groups[aid] = []
            order.append(aid)
        groups[aid].append(row)
    out: list[Row] = []
    for item in order:
        if not isinstance(item, str) or len(groups[item]) == 1:
            out.append(item if not isinstance(item, str) else groups[item][0])
            continue
        elements = groups[item]
        counts = Counter(e[0]["phase"] for e in elements)
        waiting = [e[0] for e in elements if e[0]["phase"] == "pending"]
        pub = {**(waiting[0] if waiting else elements[0][0]), "id": item,
               "phase": ", ".join(f"{n} {p}" for p, n in sorted(counts.items())),
               "node_names": [], "devices": []}  # fmt: skip
        pub["name"] = f"{pub['name']} [{len(elements)} elements]"
        out.append((pub, elements[0][1], elements[0][2]))
    return out


def public_runs_table(
    runs: Sequence[dict[str, Any]], *, title: str, with_reason: bool, expand: bool = True
) -> None:
    """``runs_table`` of runs as the server sends them (the JSON of ``status --json``); a
    request for any of several GPU types shows as ``(any type)`` until placed."""
    from datetime import datetime

    rows = []
    for pub in runs:
        shape = f"{pub['gpus']}" if pub["num_nodes"] == 1 else f"{pub['num_nodes']}x{pub['gpus']}"
        when = pub["submitted_at"]
        t = datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp() if when else None
        rows.append((pub, f"{shape} {pub['gpu_type'] or '(any type)'}", t))
    _runs_rows(rows if expand else _fold(rows), title, with_reason)


def _runs_rows(runs: Sequence[Row], title: str, with_reason: bool) -> None:
    cols = ["ID", "NAME", "PROJECT", "PRIORITY", "PHASE", "GPUS", "WHERE", "AGE"]
    if with_reason:
        cols += ["REASON", "ETA"]
    now = time.time()
    rows = []
    for pub, gpus, submitted in runs:
        where = ",".join(pub["node_names"])
        if pub["devices"]:
            where += f" [{','.join(pub['devices'])}]"
        row = [
            pub["id"],
            pub["name"],
            pub["project"],
            pub["priority"],
            pub["phase"],
            gpus,
            where or "-",
            ago(submitted, now),
        ]
        if with_reason:
            row += [pub["reason"] or "-", pub["eta"] or "-"]
        rows.append(row)
    console().print(table(title, cols, rows, wrap=("NAME", "REASON", "ETA"), limits=_REASON))
    if not runs:
        print("(none)")


def nodes_table(nodes: Sequence[dict[str, Any]]) -> None:
    """``nodes``: ``controller.views.node_rows`` with their state reasons."""
    rows = []
    for n in nodes:
        state = "ready" if n["schedulable"] else f"unschedulable {n['state_reason']}".strip()
        runs = ",".join(n["runs"]) or "-"
        rows.append([n["name"], n["backend"], n["gpu_type"], n["gpus"], n["free_gpus"], state,
                     runs])  # fmt: skip
    cols = ("NODE", "BACKEND", "GPU TYPE", "GPUS", "FREE", "STATE", "RUNS")
    console().print(table("Nodes", cols, rows))


def events_table(run_id: str, events: Sequence[Any]) -> None:
    from mlops_gpu.model.public import iso

    rows = []
    for e in events:
        phase = f"{e.phase_from or ''} -> {e.phase_to}" if e.phase_to else "-"
        lost = "-" if e.lost_gpu_s is None else f"{e.lost_gpu_s:.0f}"  # (preemptions only)
        rows.append([iso(e.time) or "-", e.attempt, e.kind, phase, e.reason, lost])
    cols = ("TIME (UTC)", "ATTEMPT", "EVENT", "PHASE", "REASON", "LOST GPU-S")
    console().print(table(f"Events of {run_id}", cols, rows, limits=_REASON))


def results_table(title: str, cols: Sequence[tuple[str, str, str]], rows: Sequence[Any]) -> None:
    """A simulator's rows (``simulate``, ``simulate --autoscale``): ``cols`` are (header, key,
    format), format ``h`` for seconds shown in hours; a missing value (None) shows as ``-``.
    ``title`` is shown literally (a trace's name may be a user's file path)."""
    from rich.table import Table

    t = Table(title=cell(title))
    for name, _, _ in cols:
        t.add_column(name, justify="left" if name == "policy" else "right")
    for row in rows:
        t.add_row(*("-" if (v := row[key]) is None else f"{v / 3600:.2f}" if fmt == "h"
                    else fmt.format(v) for _, key, fmt in cols))  # fmt: skip
    console().print(t)
