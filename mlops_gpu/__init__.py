"""mlops_gpu: a GPU scheduler for ML teams.

``import mlops_gpu as mg`` stays light: the SDK (``mg.submit``, ``mg.submit_many``,
``mg.map``, ``mg.Run``, ``mg.get_run``, ``mg.checkpoint_saved``, ``mg.gpus``, ``mg.sweep``,
``mg.tracking_uri``) is loaded on first use, and nothing here imports prefect, mlflow,
kubernetes, optuna or pandas.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_SDK = (
    "submit",
    "submit_many",
    "map",
    "Run",
    "get_run",
    "checkpoint_saved",
    "RunFailed",
    "gpus",
    "current_gpus",
    "LeaseError",
    "sweep",
    "Sweep",
    "tracking_uri",
)
__all__ = ["__version__", *_SDK]


def __getattr__(name: str) -> Any:
    if name in _SDK:
        from mlops_gpu import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'mlops_gpu' has no attribute {name!r}")
