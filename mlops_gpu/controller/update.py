"""``update_run``: change a run's priority, max runtime, GPUs or GPU type (``mlops-gpu update``,
``Run.update``, ``PATCH /api/v1/runs/{id}``), every edge the same way.

The new spec is validated exactly as at submit (``Runtime.problems``: ``core.validate``), then
written by ``state.amend.amend_run``, a compare-and-set on the spec validated and on the run's
phase (a pending run may change everything; an admitted or running run only its priority, and
its max runtime shortened). The scheduler sees the change in its next cycle through the
store's change feed; a shortened max runtime of a running run is enforced by the controller
(``model.lifecycle.overdue``), since the backend was told the old limit at launch.

``update_array``: the same change to every pending element of an array (an array id where a
run id is expected, as ``cancel``/``hold``/``release`` take), in one transaction, each element's
change an ``updated`` event; elements no longer pending are left as they are. A limited array's
single element may change only its max runtime (its elements must share one request and class,
``core.eligibility``); the whole array may change anything, since its pending elements then
still share them.
"""

from __future__ import annotations

import json
from dataclasses import replace

from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.model import Phase, Run, RunSpec
from mlops_gpu.state import ConflictError
from mlops_gpu.state.amend import active_problem, amend_many, amend_run, describe, spec_changes


class UpdateError(ValueError):
    """The update is refused, one line: a bad value (``status`` 422), no such run (404), or a
    change the run's phase does not allow or that raced another (409)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


#: What an update that changes nothing says (it writes nothing, and is no error: PATCH is
#: idempotent).
UNCHANGED = "unchanged (the values given are already the run's)"


def update_run(
    rt: Runtime,
    run_id: str,
    *,
    priority: str | None = None,
    max_runtime_s: float | None = None,
    gpus: int | None = None,
    gpu_types: tuple[str, ...] | None = None,
) -> tuple[Run, str]:
    """(the run after the change, the change in words: the ``updated`` event's reason);
    ``UpdateError`` names what is wrong (nothing written then). None leaves a field as it is."""
    _something(priority, max_runtime_s, gpus, gpu_types)
    run = rt.store.get(run_id)
    if run is None:
        raise UpdateError(f"no run with id {run_id!r}", 404)
    old = run.spec
    new = _changed(old, priority, max_runtime_s, gpus, gpu_types)
    if not (changes := spec_changes(old, new)):
        return run, UNCHANGED  # (in any phase: nothing to do is never refused)
    if (problem := active_problem(run_id, run.phase, old, new)) is not None:
        raise UpdateError(problem, 409)
    if old.array_limit is not None and (new.request != old.request or new.priority != old.priority):
        # job control passes a limited array's first pending elements on, which is exact only
        # while its elements ask for the same GPUs in the same class (``core.eligibility``)
        raise UpdateError(f"run {run_id} is an element of array {old.array_id} with a limit "
                          f"(%{old.array_limit}): its elements share one request and class, so "
                          "only --max-runtime changes one of them", 409)  # fmt: skip
    if problems := rt.problems(new):
        raise UpdateError("; ".join(problems))
    try:
        return amend_run(rt.store, run_id, old, new), describe(changes)
    except ConflictError as e:
        raise UpdateError(str(e), 409) from None
    except KeyError:
        raise UpdateError(f"no run with id {run_id!r}", 404) from None


def _something(*values: object) -> None:
    if all(v is None for v in values):
        raise UpdateError("nothing to update: give --priority, --max-runtime, --gpus or --gpu-type")


def _changed(
    old: RunSpec,
    priority: str | None,
    max_runtime_s: float | None,
    gpus: int | None,
    gpu_types: tuple[str, ...] | None,
) -> RunSpec:
    request = old.request
    if gpus is not None:
        request = replace(request, gpus=gpus)
    if gpu_types is not None:
        request = replace(request, gpu_types=gpu_types)
    return replace(
        old,
        priority=old.priority if priority is None else priority,
        max_runtime_s=old.max_runtime_s if max_runtime_s is None else max_runtime_s,
        request=request,
    )


def update_array(
    rt: Runtime,
    element_ids: list[str],
    *,
    priority: str | None = None,
    max_runtime_s: float | None = None,
    gpus: int | None = None,
    gpu_types: tuple[str, ...] | None = None,
) -> list[tuple[Run, str]]:
    """``update_run`` for every pending element of an array (``element_ids``: all of its
    elements, ``state.jobs.expand_ids``): (each element after, what happened to it), in order.
    Validated as ``update_run`` validates one run; one transaction (all pending elements change,
    or none); ``UpdateError`` 409 when no element is pending or one moved meanwhile."""
    _something(priority, max_runtime_s, gpus, gpu_types)
    elements = [r for r in (rt.store.get(i) for i in element_ids) if r is not None]
    pending = [r for r in elements if r.phase is Phase.PENDING]
    if not pending:
        aid = elements[0].spec.array_id if elements else "?"
        raise UpdateError(f"array {aid} has no pending element: only pending elements of an "
                          "array change (update one running element by its id)", 409)  # fmt: skip
    items: list[tuple[str, RunSpec, RunSpec]] = []
    judged: dict[str, list[str]] = {}  # the problems of a new spec, but for its index
    what: dict[str, str] = {}
    for run in pending:
        new = _changed(run.spec, priority, max_runtime_s, gpus, gpu_types)
        if not (changes := spec_changes(run.spec, new)):
            what[run.id] = UNCHANGED
            continue
        key = json.dumps(replace(new, array_index=None).to_dict(), sort_keys=True)
        if key not in judged:
            judged[key] = rt.problems(new)
        if judged[key]:
            raise UpdateError("; ".join(judged[key]))
        items.append((run.id, run.spec, new))
        what[run.id] = describe(changes)
    try:
        amend_many(rt.store, items, pending_only=True)
    except ConflictError as e:
        raise UpdateError(str(e), 409) from None
    except KeyError as e:  # (an element removed meanwhile: as update_run answers it)
        raise UpdateError(f"no run with id {e.args[0]!r}", 404) from None
    out: list[tuple[Run, str]] = []
    for r in elements:
        after = rt.store.get(r.id) or r
        out.append((after, what.get(r.id, f"not updated: it is {r.phase.value} (only pending "
                                          "elements of an array change)")))  # fmt: skip
    return out
