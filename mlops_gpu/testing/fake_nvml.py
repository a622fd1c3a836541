"""A fake NVML (the subset of pynvml the sampler and ``init`` use), for tests of jobs that run in
their own processes: ``MLOPS_GPU_NVML=mlops_gpu.testing.fake_nvml:from_env`` makes the launcher
sample it instead of the driver.

Four GPUs with UUIDs ``GPU-fake-0`` .. ``GPU-fake-3``: each reports the utilization given by
``MLOPS_GPU_FAKE_UTIL`` (percent, default 50), ``(index + 1)`` GiB used of 80, 100 W per index
step, and an energy counter growing 1 kJ per read.
"""

from __future__ import annotations

import os
from types import SimpleNamespace


class FakeNvml:
    def __init__(self, utilization_pct: float = 50.0, count: int = 4) -> None:
        self.utilization_pct = utilization_pct
        self.count = count
        self.energy = [0.0] * count

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < self.count:
            raise RuntimeError("Invalid Argument")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        prefix = "GPU-fake-"
        if uuid.startswith(prefix) and uuid[len(prefix) :].isdigit():
            return self.nvmlDeviceGetHandleByIndex(int(uuid[len(prefix) :]))
        raise RuntimeError("Not Found")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.utilization_pct, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 100_000 * (h + 1)  # milliwatts

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self.energy[h] += 1_000_000.0  # millijoules
        return int(self.energy[h])


def from_env() -> FakeNvml:
    return FakeNvml(float(os.environ.get("MLOPS_GPU_FAKE_UTIL", "50")))
