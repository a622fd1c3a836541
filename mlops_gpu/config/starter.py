"""The commented starter config that ``mlops-gpu init`` and ``mlops-gpu demo`` write."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PRICES = {"a100-80gb": 2.5, "a100-40gb": 1.8, "h100-80gb": 4.0, "h200-141gb": 5.0, "l4-24gb": 0.8}


@dataclass(frozen=True)
class StarterNode:
    name: str
    gpu_type: str
    #: Device ids (NVML indices) or None for virtual GPUs.
    devices: Sequence[str] | None
    gpus: int


def _yaml_char(ch: str) -> str:
    n = ord(ch)
    if ch in '"\\':
        return "\\" + ch
    # YAML's printable set, less its line breaks (NEL, LS, PS) and BOM: those are escaped
    if 0x20 <= n <= 0x7E or (
        0xA0 <= n <= 0xFFFD and n not in (0x2028, 0x2029, 0xFEFF) and not 0xD800 <= n <= 0xDFFF
    ):
        return ch
    if 0x10000 <= n <= 0x10FFFF:
        return ch
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def _quote(s: str) -> str:
    """``s`` as a YAML double-quoted scalar that reads back as exactly ``s`` (names come from
    the user: ``init --gpu-type``)."""
    return '"' + "".join(_yaml_char(ch) for ch in s) + '"'


def starter_config(
    nodes: Sequence[StarterNode],
    projects: Sequence[tuple[str, int, int]] = (("default", 0, 0),),
    *,
    source: str,
    store: str = "sqlite:///state.db",
    state_dir: str = "state",
    tracking_uri: str | None = None,
    cohort: str | None = "org",
    memory_gb: dict[str, float] | None = None,
) -> str:
    """YAML text. ``projects``: (name, nominal quota per GPU type, borrowing limit); a nominal of
    0 means "all GPUs of the type" for a single-project starter."""
    types = sorted({n.gpu_type for n in nodes})
    total = {t: sum(n.gpus for n in nodes if n.gpu_type == t) for t in types}
    out = [
        "# mlops-gpu configuration (see README.md, 'Configuration').",
        f"# Written by {source}. Unknown keys are rejected; relative paths are relative to this",
        "# file's folder.",
        "",
        "# Scheduler state: SQLite by default (WAL), or postgresql+psycopg://user@host/db.",
        f"store: {_quote(store)}",
        "# Run logs, checkpoints and supervisor records live here.",
        f"state_dir: {_quote(state_dir)}",
        "",
        "mlflow:",
        "  # null: $MLFLOW_TRACKING_URI, else sqlite:///<state_dir>/mlflow.db",
        f"  tracking_uri: {_quote(tracking_uri) if tracking_uri else 'null'}",
        "",
        "# GPU types (flavors) with their price per GPU-hour in USD, for cost reports.",
        "gpu_types:",
    ]
    for t in types:
        mem = (memory_gb or {}).get(t)
        extra = f", memory_gb: {mem:g}" if mem else ""
        out.append(f"  {_quote(t)}: {{price_per_hour: {PRICES.get(t, 1.0)}{extra}}}")
    out += [
        "",
        "# Where runs execute. 'local' runs subprocesses on this host with CUDA_VISIBLE_DEVICES",
        "# set; its nodes have real device ids (NVML indices) or a count of virtual GPUs.",
        "backends:",
        "  local:",
        "    type: local",
        "    nodes:",
    ]
    for n in nodes:
        out.append(f"      - name: {_quote(n.name)}")
        out.append(f"        gpu_type: {_quote(n.gpu_type)}")
        if n.devices is None:
            out.append(f"        gpus: {n.gpus}          # virtual GPUs")
        else:
            out.append(f"        devices: [{', '.join(_quote(d) for d in n.devices)}]")
    out += [
        "",
        "# Cohorts share their members' idle quota (a tree: parent cohorts are optional).",
        "cohorts:" + ("" if cohort else " {}"),
    ]
    if cohort:
        out.append(f"  {_quote(cohort)}: {{parent: null}}")
    out += [
        "",
        "# Projects (tenants): per GPU type a nominal quota, how much more they may borrow from",
        "# their cohort (null = no limit), and how much of their idle quota they lend.",
        "projects:",
    ]
    for name, nominal, borrow in projects:
        out.append(f"  {_quote(name)}:")
        out.append(f"    cohort: {_quote(cohort) if cohort else 'null'}")
        out.append("    weight: 1.0")
        out.append("    quotas:")
        for t in types:
            nom = nominal or total[t]
            out.append(f"      {_quote(t)}: {{nominal: {nom}, borrowing_limit: {borrow}}}")
    out += [
        "",
        "# Priority classes: higher runs first.",
        "priority_classes: {low: 0, normal: 100, high: 1000}",
        "default_priority: normal",
        "",
        "policy:",
        "  name: default",
        "  # best-effort-fifo: a blocked run does not hold back smaller runs behind it.",
        "  queueing: best-effort-fifo",
        "  # A run of the preemptor's own project and class is preempted only after running",
        "  # this long and reporting a checkpoint (mg.checkpoint_saved()), unless",
        "  # preempt_uncheckpointed is true.",
        "  min_runtime_before_preemption_s: 600",
        "  preempt_uncheckpointed: false",
        "",
        "retry:",
        "  # A lost run (node down, job deleted) is retried until it has had this many",
        "  # attempts; preemptions are the scheduler's doing and do not count.",
        "  max_attempts: 3",
        "",
        "scheduler:",
        "  tick_s: 1.0",
        "  idle_exit_s: 300",
        "",
    ]
    return "\n".join(out)
