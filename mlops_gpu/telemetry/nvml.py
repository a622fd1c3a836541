"""NVML discovery: which GPUs this host has, as GPU type names the config can use."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro"}


@dataclass(frozen=True)
class DiscoveredGpu:
    index: int
    uuid: str
    name: str
    memory_gb: float

    @property
    def gpu_type(self) -> str:
        return gpu_type_name(self.name, self.memory_gb)


def gpu_type_name(product: str, memory_gb: float) -> str:
    """``"NVIDIA A100-SXM4-80GB", 80`` -> ``"a100-80gb"``; ``"NVIDIA GeForce RTX 4090", 24``
    -> ``"rtx-4090-24gb"``."""
    tokens = [t for t in re.split(r"[\s\-_]+", product.lower()) if t and t not in _VENDOR_WORDS]
    model: list[str] = []
    for t in tokens:
        model.append(t)
        if any(c.isdigit() for c in t):
            break
    return f"{'-'.join(model) or 'gpu'}-{round(memory_gb)}gb"


def discover_gpus(nvml_seam: Any | None = None) -> list[DiscoveredGpu] | None:
    """The host's GPUs, or None when NVML is not usable here (no library or no driver).

    ``nvml_seam`` is the seam: a module-like object with pynvml's functions; default ``pynvml``.
    """
    nvml: Any = nvml_seam
    if nvml is None:
        try:
            import pynvml  # optional and only needed here: imported on use
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no usable NVML
        return None
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)
            uuid = nvml.nvmlDeviceGetUUID(h)
            mem = nvml.nvmlDeviceGetMemoryInfo(h).total / 1024**3
            out.append(
                DiscoveredGpu(
                    i,
                    uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    name.decode() if isinstance(name, bytes) else str(name),
                    mem,
                )
            )
        return out
    finally:
        nvml.nvmlShutdown()
