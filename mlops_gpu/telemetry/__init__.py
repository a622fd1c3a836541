"""GPU discovery and sampling through NVML (``pynvml``), behind a seam tests can fake.

Invariants:
- Never raises because a machine has no NVIDIA driver: discovery returns None and says so once.
- ``pynvml`` is imported inside the functions that need it, never at package import.
- Imports only ``mlops_gpu.model``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DiscoveredGpu", "discover_gpus", "gpu_type_name"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: ``python -m mlops_gpu.telemetry.launcher`` imports this package
    # first, in every job, before its command starts.
    if name in __all__:
        from mlops_gpu.telemetry import nvml

        return getattr(nvml, name)
    raise AttributeError(f"module 'mlops_gpu.telemetry' has no attribute {name!r}")
