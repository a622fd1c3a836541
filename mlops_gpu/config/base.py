"""The config models' common base and the nodes a backend lists in the file.

Invariants:
- Every model forbids unknown keys, is frozen and strict (no silent coercion).
- Imports only pydantic.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    # strict: no silent coercion (``gpus: true`` is not 1 GPU, ``"4"`` is not 4).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class NodeConfig(Strict):
    name: str = Field(min_length=1)
    gpu_type: str
    #: Number of virtual GPUs (ids 0..gpus-1), or explicit device ids.
    gpus: int | None = Field(None, ge=1, le=4096)
    devices: list[str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    #: MIG slices by profile: ``{"1g.10gb": ["MIG-...", ...]}`` (GPUs split into slices are
    #: not also listed as whole devices).
    mig: dict[str, list[str]] = Field(default_factory=dict)
    #: Let fractional and memory-capped runs share these devices (no isolation).
    shared: bool = False
    gpu_memory_mb: int | None = Field(None, gt=0)
    #: Host CPU (millicores) and memory runs may take here; unset: not tracked.
    cpu_milli: int | None = Field(None, gt=0)
    host_memory_mb: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_of(self) -> NodeConfig:
        if self.gpus is not None and self.devices is not None:
            raise ValueError("give exactly one of 'gpus' (a count) or 'devices' (a list of ids)")
        if self.gpus is None and self.devices is None and not self.mig:
            raise ValueError("give exactly one of 'gpus' (a count) or 'devices' (a list of ids)")
        for profile in self.mig:
            if not re.fullmatch(r"\d+g\.\d+gb", profile):
                raise ValueError(f"mig: expected profiles such as 1g.10gb, got {profile!r}")
        if self.devices is not None and len(set(self.devices)) != len(self.devices):
            raise ValueError("device ids must be unique")
        return self

    def device_ids(self) -> tuple[str, ...]:
        if self.devices is not None:
            return tuple(self.devices)
        return tuple(str(i) for i in range(self.gpus or 0))
