"""The launchers' last GPU samples, from the backends' polls to the store (``state.observed``),
where metrics scrapes in other processes read them (``mlops_gpu_gpu_utilization_ratio``).

Invariants:
- Only running one-node runs are sampled: a sample's position among the run's devices is
  mapped to the (node, device) its placement holds there. A gang's launchers number their
  devices per node, so a gang's samples are left out rather than put on the wrong GPU.
- The store is written only when the samples changed since the last write, at most every
  ``PUBLISH_EVERY_S`` (launchers sample every few seconds: with thousands of runs the samples
  change at every poll, and each write replaces them all), and a failed write never fails the
  tick (it is said once, and tried again at the next poll).
"""

from __future__ import annotations

import time

from mlops_gpu.backends import JobTelemetry
from mlops_gpu.model import Run
from mlops_gpu.state import Store, observed

Key = tuple[str, str]
#: The least time between two writes of the samples (metrics are scraped every 15 s or so).
PUBLISH_EVERY_S = 5.0


class GpuSamples:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.published: dict[Key, observed.GpuSample] = {}
        self.published_at = float("-inf")  # (time.monotonic)

    def collect(self) -> Poll:
        """A new poll's samples, published together at its end."""
        return Poll(self)


class Poll:
    def __init__(self, owner: GpuSamples) -> None:
        self.owner = owner
        self.samples: dict[Key, observed.GpuSample] = {}

    def add(self, run: Run, tel: JobTelemetry, now: float) -> None:
        if run.placement is None or len(run.placement.slots) != 1 or not tel.devices:
            return
        slot = run.placement.slots[0]
        at = tel.sampled_at if tel.sampled_at is not None else now
        for pos, util, mem in tel.devices:
            if pos < len(slot.devices):
                dev = slot.devices[pos]
                self.samples[(slot.node, dev)] = observed.GpuSample(
                    slot.node, dev, run.id, util, mem, at
                )

    def publish(self) -> str | None:
        """Write the samples if they changed; a one-line problem if the write failed."""
        owner = self.owner
        if self.samples == owner.published:
            return None
        # (runs that ended leave at once: their GPUs must not show a stale owner)
        gone = owner.published.keys() - self.samples.keys()
        if not gone and time.monotonic() - owner.published_at < PUBLISH_EVERY_S:
            return None
        try:
            observed.publish_samples(owner.store, self.samples.values())
        except Exception as e:  # metrics only: the scheduling goes on
            return f"could not publish GPU samples: {e}"
        owner.published, owner.published_at = self.samples, time.monotonic()
        return None
