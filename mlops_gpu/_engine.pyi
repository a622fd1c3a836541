"""Types of ``mlops_gpu._engine``, the Rust engine's PyO3 module (``native/py/src/lib.rs``),
built by ``pip install`` where cargo exists. Its one caller is ``mlops_gpu.core.native``.

Every class but ``Engine`` is immutable and built with keyword arguments only. Indices number
GPU types, backends, nodes and projects in the sorted order of their names; every method
raises ``ValueError`` for an index or time it cannot take (nothing is guessed).
"""

from typing import final

#: GPUs on one node: (node, device numbers in the node's device order).
Slot = tuple[int, list[int]]

@final
class NodeSpec:
    def __init__(
        self,
        *,
        gpu_type: int,
        backend: int,
        devices: int,
        schedulable: bool,
        labels: list[int | None],
        cpu_milli: int | None,
        host_memory_mb: int | None,
    ) -> None: ...

@final
class QuotaSpec:
    def __init__(
        self, *, nominal: float, borrowing_limit: float | None, lending_limit: float | None
    ) -> None: ...

@final
class ProjectSpec:
    def __init__(self, *, weight: float, root: int | None, quotas: list[QuotaSpec]) -> None: ...

@final
class PolicySpec:
    def __init__(
        self,
        *,
        order: str,
        las_thresholds_gpu_s: list[float],
        strict_fifo: bool,
        fair_share: bool,
        half_life_s: float,
        preemption: bool,
        backfill: bool,
        shortest_preempt_ratio: float,
        min_runtime_before_preemption_s: float,
        preempt_uncheckpointed: bool,
        placement: str,
    ) -> None: ...

@final
class Settings:
    def __init__(
        self,
        *,
        n_types: int,
        nodes: list[NodeSpec],
        multi_node: list[bool],
        projects: list[ProjectSpec],
        members: list[list[int]],
        capacity_by_type: list[float],
        of_type: list[list[int]],
        policy: PolicySpec,
    ) -> None: ...

@final
class RunSpec:
    def __init__(
        self,
        *,
        id: str,
        seq: int,
        project: int,
        priority: int,
        gpus: int,
        nodes: int,
        gpu_types: list[int],
        backend: int | None,
        topology_key: int | None,
        topology_required: bool,
        cpu_milli: int,
        host_memory_mb: int,
        max_runtime_s: float | None,
        preemptible: bool,
        grace_s: float,
        submitted_at: float,
        last_checkpoint_at: float | None,
        attained_gpu_s: float,
        accepts: list[str],
    ) -> None: ...
    @property
    def id(self) -> str: ...

@final
class Held:
    def __init__(
        self,
        *,
        backend: int,
        gpu_type: int,
        slots: list[Slot],
        gpus: int,
        admitted_at: float | None,
        started_at: float | None,
        going: bool,
    ) -> None: ...

@final
class Admitted:
    @property
    def run_id(self) -> str: ...
    @property
    def backend(self) -> int: ...
    @property
    def gpu_type(self) -> int: ...
    @property
    def slots(self) -> list[Slot]: ...

@final
class Preempted:
    @property
    def run_id(self) -> str: ...
    @property
    def for_run_id(self) -> str: ...
    @property
    def lost_gpu_s(self) -> float: ...

@final
class BudgetSpent:
    def __init__(self, *, project: int, lower_to: int | None) -> None: ...

@final
class Engine:
    def __init__(self, settings: Settings) -> None: ...
    def submit(self, run: RunSpec) -> None: ...
    def add_active(self, run: RunSpec, held: Held) -> None: ...
    def withdraw(self, id: str) -> None: ...
    def checkpoint(self, id: str, at: float) -> None: ...
    def used(self) -> list[float]: ...
    def finish(self, id: str) -> None: ...
    def anchor(self) -> str | None: ...
    def cycle(
        self,
        now: float,
        history: list[float] | None = None,
        spent: list[BudgetSpent] | None = None,
    ) -> tuple[list[Admitted], list[Preempted]]: ...
