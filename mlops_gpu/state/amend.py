"""``amend_run``: change what a queued or running run asks for (``mlops-gpu update``).

Invariants:
- One transaction, compare-and-set: the row is locked, and the change is written only if the
  run's spec is still the one the caller validated (``old``) and its phase still allows the
  change (pending: any field; admitted, starting or running: ``priority``, and ``max_runtime``
  shortened, only). Otherwise ``ConflictError`` and nothing is written, so an update that races
  an admission never half-applies: the admission (``Store.admit_many`` with the spec its
  decision assumed) or the update wins, never a mix.
- The change raises the store revision (the scheduler's ``Mirror`` reads it through
  ``Store.changed_since`` and re-queues the run as it now is) and is one ``updated`` event whose
  reason lists each field as ``old -> new``.
- ``amend_many`` changes several runs (an array's pending elements) in one transaction, each
  change its own ``updated`` event: all or none.
- Validation against the config (known class, GPU type, a request that fits) is the caller's
  (``controller.update``); this module checks only what can change under the lock.

Imports only ``mlops_gpu.model`` and the store's own modules.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from sqlalchemy import select

from mlops_gpu.model import ACTIVE_PHASES, Phase, RunSpec
from mlops_gpu.state.bulk import bump
from mlops_gpu.state.errors import ConflictError
from mlops_gpu.state.schema import events, runs

if TYPE_CHECKING:
    from mlops_gpu.model import Run
    from mlops_gpu.state.store import Store

#: Fields an active run may still change (``allowed_while_active`` says how).
ACTIVE_FIELDS = ("priority", "max_runtime")


def spec_changes(old: RunSpec, new: RunSpec) -> list[tuple[str, object, object]]:
    """(field, old value, new value) for each field ``update`` can change that differs."""
    out: list[tuple[str, object, object]] = []
    for name, a, b in (
        ("priority", old.priority, new.priority),
        ("max_runtime", old.max_runtime_s, new.max_runtime_s),
        ("gpus", old.request.gpus, new.request.gpus),
        ("gpu_type", "/".join(old.request.gpu_types), "/".join(new.request.gpu_types)),
    ):
        if a != b:
            out.append((name, a, b))
    return out


def active_problem(run_id: str, phase: Phase, old: RunSpec, new: RunSpec) -> str | None:
    """Why ``new`` cannot replace ``old`` on a run in ``phase`` (None: it can)."""
    if phase is Phase.PENDING:
        return None
    if phase not in ACTIVE_PHASES:
        return f"run {run_id} is {phase.value}; only pending or running runs can be updated"
    for name, _a, _b in spec_changes(old, new):
        if name not in ACTIVE_FIELDS:
            return (
                f"run {run_id} is {phase.value}: only --priority and a shorter --max-runtime "
                f"can change once a run is admitted (not --{name.replace('_', '-')})"
            )
    a, b = old.max_runtime_s, new.max_runtime_s
    if a != b and (b is None or (a is not None and b > a)):
        was = "unlimited" if a is None else f"{a:g}s"
        return (
            f"run {run_id} is {phase.value}: --max-runtime can only be shortened once a run is "
            f"admitted (it is {was})"
        )
    return None


def _show(v: object) -> str:
    if v is None:
        return "none"
    if isinstance(v, float):
        return f"{v:g}s"
    return str(v) or "any"


def describe(changes: list[tuple[str, object, object]]) -> str:
    """The event's reason: ``priority normal -> high; gpus 1 -> 2``."""
    return "updated by user: " + "; ".join(
        f"{name} {_show(a)} -> {_show(b)}" for name, a, b in changes
    )


def amend_run(
    store: Store, run_id: str, old: RunSpec, new: RunSpec, now: float | None = None
) -> Run:
    """Replace ``old`` with ``new`` on ``run_id`` if the run still has ``old`` and its phase
    allows the change (``active_problem``); the run as it is after. ``KeyError``: no such run;
    ``ConflictError``: the run moved or changed meanwhile (nothing written)."""
    amend_many(store, [(run_id, old, new)], now)
    got = store.get(run_id)
    assert got is not None
    return got


def amend_many(
    store: Store,
    items: list[tuple[str, RunSpec, RunSpec]],
    now: float | None = None,
    pending_only: bool = False,
) -> None:
    """``amend_run`` for several runs (run id, old spec, new spec) in one transaction: all are
    changed, or (``KeyError``, ``ConflictError``) none. ``pending_only``: a run that left
    pending meanwhile is a conflict (an array's update changes its pending elements only)."""
    now = time.time() if now is None else now
    with store._tx() as conn:
        for run_id, old, new in items:
            changes = spec_changes(old, new)
            if not changes:
                raise ConflictError(f"run {run_id}: nothing to change (the values given are "
                                    "its own)")  # fmt: skip
            row = conn.execute(select(runs).where(runs.c.id == run_id).with_for_update()).first()
            if row is None:
                raise KeyError(run_id)
            if RunSpec.from_dict(json.loads(row.spec)) != old:
                raise ConflictError(f"run {run_id} was updated meanwhile; look at it and try again")
            if pending_only and row.phase != Phase.PENDING.value:
                raise ConflictError(f"run {run_id} became {row.phase} meanwhile; try again")
            problem = active_problem(run_id, Phase(row.phase), old, new)
            if problem is not None:
                raise ConflictError(problem)
            conn.execute(
                runs.update()
                .where(runs.c.id == run_id)
                .values(spec=json.dumps(new.to_dict()), priority=new.priority, rev=bump(conn))
            )
            conn.execute(
                events.insert().values(
                    run_id=run_id, time=now, kind="updated", phase_from=None, phase_to=None,
                    attempt=row.attempt, reason=describe(changes),
                )
            )  # fmt: skip
