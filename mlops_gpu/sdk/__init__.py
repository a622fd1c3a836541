"""The Python SDK: ``mg.submit(...) -> Run`` and the ``Run`` handle (Future-like, as submitit's).

Works on the embedded default from a notebook: the config is found as the CLI finds it (or a
per-user starter is written on first use), and a background scheduler is started on submit when
none runs; it exits by itself after ``scheduler.idle_exit_s`` with nothing to do.
"""

from mlops_gpu.sdk.batch import map, submit_many
from mlops_gpu.sdk.lease import GpuLease, LeaseError, current_gpus, gpus
from mlops_gpu.sdk.run import Run, RunFailed, checkpoint_saved, get_run, submit, tracking_uri
from mlops_gpu.sdk.sweep import Sweep, sweep

__all__ = [
    "GpuLease",
    "LeaseError",
    "Run",
    "RunFailed",
    "Sweep",
    "checkpoint_saved",
    "current_gpus",
    "get_run",
    "gpus",
    "map",
    "submit",
    "submit_many",
    "sweep",
    "tracking_uri",
]
