"""Max runtime as the controller enforces it: a run's limit can be shortened after launch
(``mlops-gpu update --max-runtime``), and the backend only knows the limit it was given then.

``overdue``: the run has held its GPUs for its max runtime (as the store has it now). The
controller signals an overdue run as a cancel would (its checkpoint signal, SIGKILL after the
grace), and a run that ends overdue ends ``failed`` with the max-runtime reason, whether the
backend or the controller stopped it, and whatever its exit status (a run that traps the stop
signal and exits 0 still ran out of time). Pure.
"""

from __future__ import annotations

from mlops_gpu.model import Run


def overdue(run: Run, now: float | None) -> bool:
    """Whether ``run`` had held its GPUs for its max runtime at ``now`` (None: unknown, no)."""
    limit, start = run.spec.max_runtime_s, run.started_at
    return limit is not None and start is not None and now is not None and now - start >= limit


def ended_overdue(run: Run, exited_0: bool, finished_at: float | None, now: float) -> bool:
    """Whether ``run``, which ended (at ``finished_at`` by the backend's clock, None: unknown),
    ended for its max runtime: it had run that long when it ended, even if it trapped the
    controller's stop signal and exited 0. Without the job's own end time, an exit 0 seen only
    at ``now`` may have come before the limit: only a failure counts as overdue then."""
    if finished_at is not None:
        return overdue(run, finished_at)
    return not exited_0 and overdue(run, now)
