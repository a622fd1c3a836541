"""The core's input as the controller builds it: the template (nodes, projects, classes, policy,
capabilities from the running config) plus runs and the usage ledger (fair share, budgets).

Reads the runtime and the store; decides nothing. ``Controller`` ticks and the read verbs
(``views``) build their snapshots here, so both see the cluster the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mlops_gpu.controller import accounting
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.core import Snapshot
from mlops_gpu.model import Run
from mlops_gpu.state import UsageRow


def build_snapshot(
    rt: Runtime,
    pending: list[Run],
    active: list[Run],
    now: float,
    with_usage: bool = True,
    ledger: Callable[[float], list[UsageRow]] | None = None,
) -> Snapshot:
    """The core's input. ``with_usage`` reads the ledger for fair share and budgets (a read
    verb such as ``nodes`` needs neither); ``ledger(since)`` gives its rows (default: read
    them from the store)."""
    tmpl = template(rt, now)
    history: dict[tuple[str, str], float] = {}
    spent: dict[str, tuple[float, float]] = {}
    if with_usage:
        history, spent = usage_inputs(rt, tmpl, active, ledger)
    return replace(
        tmpl,
        pending=tuple(pending),
        active=tuple(active),
        usage_history=history,
        spent=spent,
    )


def usage_inputs(
    rt: Runtime,
    tmpl: Snapshot,
    active: list[Run],
    ledger: Callable[[float], list[UsageRow]] | None = None,
) -> tuple[dict[tuple[str, str], float], dict[str, tuple[float, float]]]:
    """(decayed usage history for fair share, what budgeted projects spent) at ``tmpl.now``,
    from the ledger; projects, prices and policy come from the template (``template``)."""
    now, half_life = tmpl.now, tmpl.policy.half_life_s
    since = accounting.ledger_since(now, half_life, tmpl.projects)
    rows = ledger(since) if ledger is not None else rt.store.usage(since=since)
    history = accounting.usage_history(rows, now, half_life)
    spent = accounting.spent(rows, active, now, tmpl.projects, tmpl.gpu_types)
    return history, spent


def template(rt: Runtime, now: float) -> Snapshot:
    """The core's input without runs or usage: nodes, projects, classes, policy, capabilities."""
    cfg = rt.cfg
    return Snapshot(
        now=now,
        nodes=tuple(rt.nodes()),
        pending=(),
        active=(),
        projects=cfg.model_projects(),
        gpu_types=cfg.model_gpu_types(),
        priority_classes=dict(cfg.priority_classes),
        cohorts=cfg.model_cohorts(),
        policy=cfg.policy_settings(),
        capabilities={n: b.capabilities for n, b in rt.backends.items()},
    )
