"""Sampling exactly a run's GPUs through NVML, named the way MLflow's system metrics are.

``CUDA_VISIBLE_DEVICES`` lists the run's devices as NVML indices (``"2,3"``), GPU UUIDs
(``"GPU-..."``) or MIG device UUIDs (``"MIG-..."``); each resolves to an NVML handle. Metric
``system/gpu_{i}_...`` is the run's ``i``-th device (its position in that list), never the host's
``i``-th GPU: a run on devices 2 and 3 logs ``gpu_0`` from device 2 and ``gpu_1`` from device 3.

Invariants:
- Never raises for want of a driver: without NVML, ``GpuSampler.available`` is False,
  ``note`` says why (once), and ``sample`` returns nothing.
- A value NVML cannot give for a device (power on some MIG slices, energy on older GPUs) is left
  out of that sample, not reported as 0.
- ``pynvml`` is imported on first use, never at module import; ``nvml`` is the seam for tests.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Any, NamedTuple

#: Signs of the NVIDIA kernel driver (its procfs folder; its control device, which containers
#: get): with neither there is no driver to ask. Checked before importing pynvml, ~10 ms that
#: every job on a driverless node would otherwise pay.
DRIVER_SIGNS = ("/proc/driver/nvidia", "/dev/nvidiactl")


class GpuSample(NamedTuple):  # a NamedTuple, not a dataclass: no ``inspect`` import per job
    position: int  # among the run's devices
    device: str  # as CUDA_VISIBLE_DEVICES names it
    utilization_pct: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None
    power_w: float | None
    energy_j: float | None  # total since the driver loaded

    def metrics(self) -> dict[str, float]:
        """MLflow's own system-metric names for this device."""
        p = f"system/gpu_{self.position}_"
        out: dict[str, float] = {}
        if self.utilization_pct is not None:
            out[p + "utilization_percentage"] = self.utilization_pct
        if self.memory_used_mb is not None:
            out[p + "memory_usage_megabytes"] = self.memory_used_mb
            if self.memory_total_mb:
                out[p + "memory_usage_percentage"] = (
                    100.0 * self.memory_used_mb / self.memory_total_mb
                )
        if self.power_w is not None:
            out[p + "power_usage_watts"] = self.power_w
        return out


def visible_devices(value: str | None) -> list[str]:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value (empty or unset: none)."""
    return [d.strip() for d in (value or "").split(",") if d.strip()]


def _load_nvml() -> Any:
    """``pynvml``, or the object ``MLOPS_GPU_NVML=module:factory`` names (a seam for tests of
    jobs that run in their own processes, e.g. ``mlops_gpu.testing.fake_nvml:from_env``)."""
    seam = os.environ.get("MLOPS_GPU_NVML")
    if seam:
        module, _, factory = seam.partition(":")
        try:
            return getattr(importlib.import_module(module), factory)()
        except (ImportError, AttributeError, TypeError) as e:
            raise ImportError(f"MLOPS_GPU_NVML={seam!r} cannot be loaded: {e}") from e
    if os.path.isdir("/proc/self") and not any(os.path.exists(p) for p in DRIVER_SIGNS):
        raise ImportError(f"no NVIDIA driver loaded (no {' or '.join(DRIVER_SIGNS)})")
    try:
        import pynvml  # only the launcher samples: imported on use
    except ImportError:
        raise ImportError("the nvidia-ml-py package is not installed") from None
    return pynvml


class GpuSampler:
    def __init__(self, devices: list[str], nvml: Any | None = None) -> None:
        self.devices = devices
        self.note = ""
        self.handles: list[tuple[str, Any]] = []
        self._nvml: Any = nvml
        if not devices:
            self.note = "no GPUs visible to this run (CUDA_VISIBLE_DEVICES is empty)"
            return
        if self._nvml is None:
            try:
                self._nvml = _load_nvml()
            except ImportError as e:
                self.note = f"no NVML: {e}"
                return
        try:
            self._nvml.nvmlInit()
        except Exception as e:  # no library, no driver: no NVML on this machine
            self.note = f"no NVML: {e or type(e).__name__}"
            self._nvml = None
            return
        for dev in devices:
            try:
                self.handles.append((dev, self._handle(dev)))
            except Exception as e:
                self.note = f"device {dev!r} of CUDA_VISIBLE_DEVICES is unknown to NVML: {e}"

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def _handle(self, dev: str) -> Any:
        nvml = self._nvml
        if dev.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(dev))
        return nvml.nvmlDeviceGetHandleByUUID(dev)  # GPU-... and MIG-... alike

    def sample(self) -> list[GpuSample]:
        out = []
        for pos, (dev, h) in enumerate(self.handles):
            util = self._try(lambda h=h: float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu))
            mem = self._try(lambda h=h: self._nvml.nvmlDeviceGetMemoryInfo(h))
            power = self._try(lambda h=h: self._nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
            energy = self._try(
                lambda h=h: self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
            )
            out.append(
                GpuSample(
                    pos,
                    dev,
                    util,
                    None if mem is None else mem.used / 2**20,
                    None if mem is None else mem.total / 2**20,
                    power,
                    energy,
                )
            )
        return out

    @staticmethod
    def _try(read: Any) -> Any:
        try:
            return read()
        except Exception:  # NotSupported on this device or slice: leave the value out
            return None

    def close(self) -> None:
        if self._nvml is not None and self.handles:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
