"""Named policies for the simulator: each is the one core with different switches, never a copy
of the policy.

``quotas``: whether trace projects keep their own queues and nominal quotas (in one cohort, so
idle quota is lent), or all jobs share one pool with the whole cluster as its quota (a policy
"without quotas"). Metrics always use the trace's projects, whatever the policy saw.

Pinned references (BENCHMARKS.md), so that no score is raised by weakening them:
- ``fifo``: one pool, submit order, strict FIFO (nothing passes a blocked head), no backfill,
  no preemption;
- ``fifo-backfill``: one pool, submit order, EASY backfill with a reservation for the oldest
  blocked job (estimates: ``max_runtime`` = 2 x true duration), no preemption;
- ``srtf-oracle``: one pool, shortest true remaining time first (``max_runtime`` = the true
  remaining time, ``order: shortest``), preempting a running job whose remaining time is longer
  than the new job's; a near-bound on average JCT, not a contender.
Baselines: ``kueue-like`` (nominal quota and cohort borrowing, best-effort FIFO, oldest queue
head first across projects, no fair share, reclaim of lent quota, no backfill), ``drf``
(weighted dominant share of current allocation only, no quota limits, no preemption), ``las``
(Tiresias' discretized 2D-LAS in one pool, preempting jobs in a higher service level).
``default`` is the product's policy as shipped. The references that preempt within a class
(``srtf-oracle``, ``las``) model systems without a minimum runtime or a checkpoint condition
(``min_runtime_before_preemption_s: 0``, ``preempt_uncheckpointed: true``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlops_gpu.model import PolicySettings


@dataclass(frozen=True)
class Preset:
    name: str
    settings: PolicySettings
    quotas: bool
    about: str
    #: nominal quotas become unlimited (fair share only, no limits)
    unlimited: bool = False
    #: ``max_runtime`` = this x the true remaining time (2 for every policy but the oracle)
    estimate_factor: float = 2.0
    extra: dict[str, object] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "default",
            PolicySettings(),
            quotas=True,
            about="mlops_gpu's policy: quotas with borrowing, fair share, preemption, backfill",
        ),
        Preset(
            "fifo",
            PolicySettings(
                name="default",
                order="submit",
                queueing="strict-fifo",
                fair_share=False,
                preemption=False,
                backfill=False,
            ),
            quotas=False,
            about="submit order, strict FIFO, nothing else",
        ),
        Preset(
            "fifo-backfill",
            PolicySettings(order="submit", fair_share=False, preemption=False, backfill=True),
            quotas=False,
            about="submit order with EASY backfill (Slurm-like), no preemption",
        ),
        Preset(
            "kueue-like",
            PolicySettings(order="submit", fair_share=False, preemption=True, backfill=False),
            quotas=True,
            about="nominal quota + cohort borrowing, best-effort FIFO, reclaim, no fair share",
        ),
        Preset(
            "drf",
            PolicySettings(order="submit", half_life_s=1.0, preemption=False, backfill=False),
            quotas=True,
            unlimited=True,
            about="weighted dominant share of current allocation, no quota limits",
        ),
        Preset(
            "srtf-oracle",
            PolicySettings(
                order="shortest",
                shortest_preempt_ratio=1.0,
                min_runtime_before_preemption_s=0.0,
                preempt_uncheckpointed=True,
                fair_share=False,
                preemption=True,
                backfill=False,
            ),
            quotas=False,
            estimate_factor=1.0,
            about="shortest true remaining time first, preemptive, one pool (a reference)",
        ),
        Preset(
            "las",
            PolicySettings(
                order="las",
                fair_share=False,
                preemption=True,
                backfill=False,
                min_runtime_before_preemption_s=0.0,
                preempt_uncheckpointed=True,
            ),
            quotas=False,
            about="Tiresias 2D-LAS (discretized attained service), preemptive, one pool",
        ),
    ]
}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(PRESETS)}") from None
