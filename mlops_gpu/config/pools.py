"""``pools:``: elastic node pools (``model.pool``), validated key by key.

Invariants:
- ``min_nodes <= max_nodes``, ``gpus_per_node >= 1``, times and prices are non-negative; a pool
  names a backend and a GPU type the config defines (``pool_errors``, called by ``Config``).
- The live scheduler acts on pools of Slurm backends (``controller.pools``, Slurm's power
  saving) and of Kubernetes backends (placeholder pods an autoscaler provisions nodes for);
  pools of other backends (local, fake) are not acted on: ``NOT_ACTED_ON`` names them, in the
  log line at start and in ``scheduler status``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mlops_gpu.model import Pool

NOT_ACTED_ON = (
    "pools: {names} configured but not acted on: the live scheduler scales pools of Slurm and "
    "Kubernetes backends only (other pools are used by 'mlops-gpu simulate --autoscale')"
)
#: Backend types whose pools the live scheduler acts on.
ACTED_ON_TYPES = frozenset({"slurm", "kubernetes"})


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    backend: str
    gpu_type: str
    gpus_per_node: int = Field(ge=1, le=4096)
    min_nodes: int = Field(0, ge=0)
    max_nodes: int = Field(ge=1)
    #: Seconds from asking for a node until it takes runs.
    boot_s: float = Field(300.0, ge=0)
    #: USD per node-hour, booting included.
    price_per_node_hour: float = Field(0.0, ge=0)
    #: Seconds an up node stays with no run and no reservation before it is powered down.
    idle_s: float = Field(600.0, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> PoolConfig:
        if self.min_nodes > self.max_nodes:
            raise ValueError(
                f"min_nodes ({self.min_nodes}) must be at most max_nodes ({self.max_nodes})"
            )
        return self

    def model(self, name: str) -> Pool:
        return Pool(
            name,
            self.backend,
            self.gpu_type,
            self.gpus_per_node,
            self.min_nodes,
            self.max_nodes,
            self.boot_s,
            self.price_per_node_hour,
            self.idle_s,
        )


def pool_errors(
    pools: Mapping[str, PoolConfig], backends: Mapping[str, Any], gpu_types: Mapping[str, Any]
) -> list[str]:
    """One sentence per pool that names a backend or GPU type the config lacks."""
    errors = []
    for name, p in pools.items():
        if p.backend not in backends:
            errors.append(
                f"pools.{name}.backend: unknown backend {p.backend!r} "
                f"(expected one of {', '.join(sorted(backends))})"
            )
        if p.gpu_type not in gpu_types:
            errors.append(f"pools.{name}.gpu_type: unknown GPU type {p.gpu_type!r}")
    return errors


def acted_on(pools: Mapping[str, PoolConfig], backends: Mapping[str, Any]) -> list[str]:
    """Names of the pools the live scheduler scales: those of a backend whose ``type`` is in
    ``ACTED_ON_TYPES``."""
    types = {n: getattr(b, "type", "") for n, b in backends.items()}
    return sorted(n for n, p in pools.items() if types.get(p.backend) in ACTED_ON_TYPES)


def not_acted_on(pools: Mapping[str, PoolConfig], backends: Mapping[str, Any]) -> str | None:
    """The sentence to say when a config has pools the live scheduler ignores, or None."""
    left = sorted(set(pools) - set(acted_on(pools, backends)))
    return NOT_ACTED_ON.format(names=", ".join(left)) if left else None
