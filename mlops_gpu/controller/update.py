"""``update_run``: change a run's priority, max runtime, GPUs or GPU type (``mlops-gpu update``,
``Run.update``, ``PATCH /api/v1/runs/{id}``), every edge the same way.

The new spec is validated exactly as at submit (``Runtime.problems``: ``core.validate``), then
written by ``state.amend.amend_run``, a compare-and-set on the spec validated and on the run's
phase (a pending run may change everything; an admitted or running run only its priority, and
its max runtime shortened). The scheduler sees the change in its next cycle through the
store's change feed; a shortened max runtime of a running run is enforced by the controller
(``overtime``), since the backend was told the old limit at launch.
"""

from __future__ import annotations

from dataclasses import replace

from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.model import Run
from mlops_gpu.state import ConflictError
from mlops_gpu.state.amend import active_problem, amend_run, describe, spec_changes


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
    if priority is None and max_runtime_s is None and gpus is None and gpu_types is None:
        raise UpdateError("nothing to update: give --priority, --max-runtime, --gpus or --gpu-type")
    run = rt.store.get(run_id)
    if run is None:
        raise UpdateError(f"no run with id {run_id!r}", 404)
    old = run.spec
    request = old.request
    if gpus is not None:
        request = replace(request, gpus=gpus)
    if gpu_types is not None:
        request = replace(request, gpu_types=gpu_types)
    new = replace(
        old,
        priority=old.priority if priority is None else priority,
        max_runtime_s=old.max_runtime_s if max_runtime_s is None else max_runtime_s,
        request=request,
    )
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
