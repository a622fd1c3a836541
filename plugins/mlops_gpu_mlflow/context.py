"""``mlflow.run_context_provider`` ``mlops-gpu``: a run started inside a scheduled job (one whose
environment has ``MLOPS_GPU_RUN_ID``, as every backend sets it) is tagged with the scheduled run
and attempt, so runs a training script starts itself are linked to the scheduler's records.

Invariants: outside a scheduled job it adds nothing; it reads only the environment. It does
not import mlflow (MLflow's registry only calls ``in_context`` and ``tags``), so importing it
first cannot start a circular import of mlflow's plugin registry.
"""

from __future__ import annotations

import os

#: environment variable -> tag
ENV_TAGS = {
    "MLOPS_GPU_RUN_ID": "mlops_gpu.run_id",
    "MLOPS_GPU_ATTEMPT": "mlops_gpu.attempt",
}


class MlopsGpuRunContext:
    """MLflow's ``RunContextProvider`` protocol."""

    def in_context(self) -> bool:
        return bool(os.environ.get("MLOPS_GPU_RUN_ID"))

    def tags(self) -> dict[str, str]:
        return {tag: os.environ[var] for var, tag in ENV_TAGS.items() if os.environ.get(var)}
