"""Policy switches (the config's ``policy`` section), as plain data the core reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Policy switches from the config's ``policy`` section."""

    name: str = "default"
    #: ``best-effort-fifo``: a blocked run does not block smaller runs behind it;
    #: ``strict-fifo``: within a project, nothing starts ahead of a blocked older run.
    queueing: str = "best-effort-fifo"
    #: Order inside a priority class and project: ``submit`` time, or ``las`` (least attained
    #: GPU-service first, discretized at ``las_thresholds_gpu_s``, as Tiresias' 2D-LAS).
    order: str = "submit"
    las_thresholds_gpu_s: tuple[float, ...] = (3600.0, 36000.0)
    #: Order across projects by weighted dominant share (allocation + decayed usage).
    fair_share: bool = True
    half_life_s: float = 4 * 3600.0
    preemption: bool = True
    backfill: bool = True
