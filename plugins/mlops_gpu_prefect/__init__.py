"""mlops-gpu's Prefect integration: the ``mlops-gpu`` work-pool worker type, registered through
the ``prefect.collections`` entry point (as prefect-kubernetes registers its worker).

Prefect imports collections when it looks up worker types and in its server: this module
imports only Prefect's worker base classes; mlops_gpu's scheduler is imported when a flow run
is submitted.
"""

from mlops_gpu_prefect.decorators import gpu_flow, gpu_task
from mlops_gpu_prefect.worker import (
    MlopsGpuJobConfiguration,
    MlopsGpuVariables,
    MlopsGpuWorker,
    MlopsGpuWorkerResult,
)

__all__ = [
    "MlopsGpuJobConfiguration",
    "MlopsGpuVariables",
    "MlopsGpuWorker",
    "MlopsGpuWorkerResult",
    "gpu_flow",
    "gpu_task",
]
