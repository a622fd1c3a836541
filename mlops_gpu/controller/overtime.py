"""Max runtime as the controller enforces it: a run's limit can be shortened after launch
(``mlops-gpu update --max-runtime``), and the backend only knows the limit it was given then.

``overdue``: the run has held its GPUs for its max runtime (as the store has it now). The
controller signals an overdue run as a cancel would (its checkpoint signal, SIGKILL after the
grace), and a run that ends overdue ends ``failed`` with the max-runtime reason, whether the
backend or the controller stopped it. Pure.
"""

from __future__ import annotations

from mlops_gpu.model import Run


def overdue(run: Run, now: float) -> bool:
    limit, start = run.spec.max_runtime_s, run.started_at
    return limit is not None and start is not None and now - start >= limit
