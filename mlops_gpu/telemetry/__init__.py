"""GPU discovery and sampling through NVML (``pynvml``), behind a seam tests can fake.

Invariants:
- Never raises because a machine has no NVIDIA driver: discovery returns None and says so once.
- ``pynvml`` is imported inside the functions that need it, never at package import.
- Imports only ``mlops_gpu.model``.
"""

from mlops_gpu.telemetry.nvml import DiscoveredGpu, discover_gpus, gpu_type_name

__all__ = ["DiscoveredGpu", "discover_gpus", "gpu_type_name"]
