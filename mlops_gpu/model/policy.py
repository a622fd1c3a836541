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
    #: Order inside a priority class and project: ``shortest`` (shortest ``max_runtime``
    #: first, runs without one last: shortest-job-first on the users' estimates), ``submit``
    #: time, or ``las`` (least attained GPU-service first, discretized at
    #: ``las_thresholds_gpu_s``, as Tiresias' 2D-LAS). ``las`` and ``shortest`` also let a run
    #: preempt a run of its own project and class that is further back in that order: one in
    #: a later LAS level; one expected to run on for more than ``shortest_preempt_ratio``
    #: times the run's whole ``max_runtime``.
    order: str = "shortest"
    #: 1 is plain shortest-remaining-time-first; a larger ratio preempts only where the gain is
    #: large, which keeps most of the JCT gain with far less lost work and churn (measured in
    #: ``benchmarks/philly_week.py``).
    shortest_preempt_ratio: float = 8.0
    #: Under ``shortest``: that preemption also takes a run of another project of the cohort
    #: tree that borrowed its GPU type when the cycle began, when that project's fair share is
    #: more than ``borrower_share_ratio`` times the preemptor's (``core.borrowers``; in Rust
    #: ``native/src/preempt/borrowers.rs``; shares are divided by weights, so a ratio is their
    #: one scale-free margin).
    shortest_preempt_borrowers: bool = False
    borrower_share_ratio: float = 1.0
    #: A run of the preemptor's own project and class (``las``, ``shortest``) is a victim
    #: only after running this long (KAI-Scheduler's guaranteed minimum runtime): seconds
    #: since it started (or was admitted). Lower classes and reclaimed borrowing ignore it.
    min_runtime_before_preemption_s: float = 600.0
    #: Whether such a same-class victim may be one that has not reported a checkpoint
    #: (``mg.checkpoint_saved()``); by default it may not (it would restart from zero).
    preempt_uncheckpointed: bool = False
    las_thresholds_gpu_s: tuple[float, ...] = (3600.0, 36000.0)
    #: Order across projects by weighted dominant share (allocation + decayed usage).
    fair_share: bool = True
    half_life_s: float = 3600.0
    preemption: bool = True
    backfill: bool = True
    #: Node choice: ``fragmentation`` (where GPUs can be shared or nodes track CPU and memory,
    #: the node and device that least raise the expected fragmentation for the cluster's own
    #: mix of run shapes, as FGD does; elsewhere best fit) or plain ``best-fit``.
    placement: str = "fragmentation"
