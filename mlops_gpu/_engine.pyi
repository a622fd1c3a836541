"""Types of ``mlops_gpu._engine``, the Rust engine's PyO3 module (``native/py/src/lib.rs``),
built by ``pip install`` where cargo exists. Its one caller is ``mlops_gpu.engines.native``.

Every class but ``Engine`` is immutable and built with keyword arguments only. Indices number
GPU types, backends, nodes and projects in the sorted order of their names; every method
raises ``ValueError`` for an index or time it cannot take (nothing is guessed).
"""

from typing import Any, TypeVar, final

_T = TypeVar("_T")

#: GPUs on one node: (node, device numbers: its whole devices in the node's order, then its
#: MIG slices, profile after profile as its ``PartSpec`` lists them).
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
        shortest_preempt_borrowers: bool,
        borrower_share_ratio: float,
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
        parts: list[PartSpec] = ...,
        shape_prior: list[PriorShape] = ...,
    ) -> None: ...

@final
class PriorShape:
    """One shape of ``Snapshot.shape_prior`` and its count (finite, not negative): GPUs, each
    GPU's share, host CPU and memory, the accepted types by name (any order; empty: any) and
    the cluster's among them."""

    def __init__(
        self,
        *,
        gpus: int,
        share: float,
        cpu_milli: int,
        host_memory_mb: int,
        accepts: list[str],
        gpu_types: list[int],
        count: float,
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
        shape: ShapeSpec | None = None,
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
        shares: list[SlotShare] | None = None,
        charged: float | None = None,
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
    @property
    def fraction(self) -> float: ...

@final
class Preempted:
    @property
    def run_id(self) -> str: ...
    @property
    def for_run_id(self) -> str: ...
    @property
    def lost_gpu_s(self) -> float: ...
    #: taken by ``policy.shortest_preempt_borrowers``: (the victim's project's fair share, the
    #: preemptor's) as the plan was chosen; None for any other victim
    @property
    def borrower_shares(self) -> tuple[float, float] | None: ...

#: (type, project, GPUs borrowed, reclaimable runs shown, how many, runs not preemptible
#: shown, how many); a run: (id, expected end or None)
Borrower = tuple[
    int, int, float, list[tuple[str, float | None]], int, list[tuple[str, float | None]], int
]
#: (kind, GPUs, project, run ids shown, how many)
NoEta = tuple[str, float, int | None, list[str], int]

@final
class Reason:
    @property
    def code(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def types(self) -> list[int]: ...
    @property
    def quota(self) -> list[tuple[int, str, float, float]]: ...
    @property
    def blocks(self) -> list[tuple[int, int]]: ...
    @property
    def borrowers(self) -> list[Borrower]: ...
    @property
    def lent(self) -> bool: ...
    @property
    def gpus_held(self) -> bool: ...
    @property
    def anchor(self) -> str: ...
    @property
    def at(self) -> float: ...
    @property
    def res_project(self) -> int: ...
    @property
    def res_type(self) -> int: ...

@final
class Explanation:
    @property
    def reasons(self) -> list[Reason]: ...
    @property
    def no_eta(self) -> list[NoEta]: ...
    @property
    def run_ids(self) -> list[str]: ...
    @property
    def reason(self) -> list[int]: ...
    @property
    def eta(self) -> list[float | None]: ...
    @property
    def why(self) -> list[int | None]: ...
    def pending_objects(self, cls: type[_T], codes: list[Any], sentences: list[str]) -> list[_T]:
        """One ``cls`` per pending run (``run_id``, ``reason_code``, ``reason``, ``eta`` set
        as ``object.__setattr__`` sets them; ``codes``: one per reason)."""

@final
class BudgetSpent:
    def __init__(self, *, project: int, lower_to: int | None) -> None: ...

@final
class MigSpec:
    def __init__(self, *, profile: int, slices: int) -> None: ...

@final
class PartSpec:
    def __init__(
        self,
        *,
        node: int,
        mig: list[MigSpec],
        mig_placeable: bool,
        shared: bool,
        shared_node: bool,
        gpu_memory_mb: int | None,
        name_rank: list[int],
    ) -> None: ...

@final
class ShapeSpec:
    def __init__(
        self,
        *,
        mig: int | None = None,
        mig_share: float = 1.0,
        fraction: float | None = None,
        memory_mb: int | None = None,
        cpu_only: bool = False,
    ) -> None: ...

@final
class SlotShare:
    def __init__(self, *, fraction: float, memory_mb: int | None) -> None: ...

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
    def set_anchor(self, id: str | None = None) -> None: ...
    def explain(
        self,
        now: float,
        history: list[float] | None = None,
        spent: list[BudgetSpent] | None = None,
    ) -> Explanation: ...
    def cycle(
        self,
        now: float,
        history: list[float] | None = None,
        spent: list[BudgetSpent] | None = None,
    ) -> tuple[list[Admitted], list[Preempted]]: ...
