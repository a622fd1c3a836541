"""What an attempt's MLflow run shows: its tags, its params (the run's request), and how its
metrics are rounded.

Invariants:
- ``mlflow.user`` is the submitting user (MLflow's "Created by" / "User"), as is
  ``mlops_gpu.user``; the scheduler's own OS user never appears.
- Params hold the request as submitted (the same for every attempt, so a requeued attempt's
  run shows it too); a value longer than MLflow's limit (``PARAM_MAX`` characters) is cut and
  ends with ``TRUNCATED``, so a cut command is never mistaken for the whole one.
- Metrics are rounded to what a reader can use: GPU-hours to 4 decimals (0.36 GPU-seconds),
  waits, utilization and lost work to a tenth; cost to a millionth of a dollar, the usage
  report's own precision, so that MLflow's costs of many short attempts (a tenth of a cent
  each) still add up to the report's total (cents made a 12-attempt demo's $0.06 read $0.04).
"""

from __future__ import annotations

import shlex

from mlops_gpu.model import Run

#: MLflow's limit on a param value (``mlflow.utils.validation.MAX_PARAM_VAL_LENGTH``).
PARAM_MAX = 6000
TRUNCATED = " ...[truncated]"
#: metric -> decimals
ROUND = {
    "mlops_gpu.gpu_hours": 4,
    "mlops_gpu.cost_usd": 6,
    "mlops_gpu.queue_wait_s": 1,
    "mlops_gpu.mean_gpu_utilization": 1,
    "mlops_gpu.lost_gpu_s": 1,
}


def tags(run: Run) -> dict[str, str]:
    """The attempt's tags (``run`` is admitted: it has a placement)."""
    p = run.placement
    assert p is not None
    return {
        **recovered_tags(run, run.attempt, p.gpu_type),
        "mlops_gpu.backend": p.backend,
        "mlops_gpu.nodes": ",".join(p.node_names),
        "mlops_gpu.gpu_uuids": ",".join(d for s in p.slots for d in s.devices),
    }


def recovered_tags(run: Run, attempt: int, gpu_type: str) -> dict[str, str]:
    """The tags of an attempt's MLflow run made after a restart, from the store's records (the
    attempt's nodes and devices are no longer known); ``tags`` adds those to them."""
    return {
        "mlops_gpu.run_id": run.id,
        "mlops_gpu.project": run.project,
        "mlops_gpu.user": run.spec.user,
        "mlflow.user": run.spec.user,
        "mlops_gpu.priority": run.spec.priority,
        "mlops_gpu.gpu_type": gpu_type,
        "mlops_gpu.attempt": str(attempt),
    }


def params(run: Run) -> dict[str, str]:
    """The run's request: GPUs per node, nodes, acceptable GPU types, priority class, max runtime
    (seconds, or ``none``) and the command."""
    s, r = run.spec, run.spec.request
    gpus = f"{r.gpu_fraction:g}" if r.gpu_fraction is not None else str(r.gpus)
    if r.mig is not None:
        gpus += f" x {r.mig}"
    return {
        "gpus": gpus,
        "nodes": str(r.nodes),
        "gpu_type": ",".join(r.gpu_types) or "any",
        "priority": s.priority,
        "max_runtime": "none" if s.max_runtime_s is None else f"{s.max_runtime_s:g}",
        "command": cut(shlex.join(s.command)),
    }


def cut(value: str) -> str:
    """``value`` within MLflow's param limit, marked when cut."""
    if len(value) <= PARAM_MAX:
        return value
    return value[: PARAM_MAX - len(TRUNCATED)] + TRUNCATED


def experiment_artifacts(root: str | None, name: str) -> str | None:
    """Where experiment ``name``, created by mlops-gpu, keeps its artifacts: a folder of
    ``root`` named after it (None: MLflow's default)."""
    if not root:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"
    return f"{root.rstrip('/')}/{safe}"


def rounded(key: str, value: float) -> float:
    return round(value, ROUND[key]) if key in ROUND else value
