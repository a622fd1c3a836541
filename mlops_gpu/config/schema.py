"""The config schema (pydantic, every model forbids unknown keys) and its conversion to model
values.

Invariants:
- ``backends`` accepts exactly the backend types of the registry (``config.registry``: the
  built-ins and the ``mlops_gpu.backends`` entry point group), told apart by ``type``.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import Field, PrivateAttr, model_validator

from mlops_gpu.config.backends import BackendConfigBase
from mlops_gpu.config.base import Strict as _Strict
from mlops_gpu.config.pools import PoolConfig, pool_errors
from mlops_gpu.config.registry import backend_types
from mlops_gpu.config.server import ProjectRole, ServerConfig
from mlops_gpu.model import Budget, Cohort, GpuType, Node, PolicySettings, Project, Quota

NonNeg = Annotated[int, Field(ge=0)]


class GpuTypeConfig(_Strict):
    price_per_hour: float = Field(0.0, ge=0, description="USD per GPU-hour")
    memory_gb: float | None = Field(None, gt=0)


class QuotaConfig(_Strict):
    nominal: NonNeg = 0
    borrowing_limit: NonNeg | None = 0
    lending_limit: NonNeg | None = None


class BudgetConfig(_Strict):
    #: The rolling window the budget covers, in seconds (604800 = a week).
    window_s: float = Field(gt=0)
    gpu_hours: float | None = Field(None, gt=0)
    usd: float | None = Field(None, gt=0)
    #: When spent: ``wait`` (runs queue until the window frees budget) or ``lower`` (runs go
    #: on at priority class ``lower_to``).
    action: Literal["wait", "lower"] = "wait"
    lower_to: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> BudgetConfig:
        if self.gpu_hours is None and self.usd is None:
            raise ValueError("give gpu_hours, usd or both")
        if self.action == "lower" and self.lower_to is None:
            raise ValueError("action 'lower' needs lower_to (a priority class)")
        return self


class ProjectConfig(_Strict):
    cohort: str | None = None
    weight: float = Field(1.0, gt=0)
    quotas: dict[str, QuotaConfig] = Field(default_factory=dict)
    budget: BudgetConfig | None = None
    #: user -> role in this project, for ``mlops-gpu server`` (admins add more with
    #: ``mlops-gpu users add --project``)
    members: dict[str, ProjectRole] = Field(default_factory=dict)


class CohortConfig(_Strict):
    parent: str | None = None


if TYPE_CHECKING:
    BackendConfig = BackendConfigBase
else:
    # The union follows the registry: a backend installed as a plugin is a type here.
    BackendConfig = Annotated[
        Union[tuple(backend_types().values())],  # noqa: UP007 (built at run time)
        Field(discriminator="type"),
    ]


class MlflowConfig(_Strict):
    tracking_uri: str | None = None
    #: Where experiments the scheduler creates keep their artifacts (a folder, relative to the
    #: config file, or a URI such as s3://bucket/mlflow); null: <state_dir>/mlartifacts with a
    #: local store, the server's own default with an MLflow server.
    artifact_root: str | None = None
    #: false: the scheduler creates no MLflow runs (jobs get no MLFLOW_RUN_ID); for clusters
    #: that do not use MLflow, and for measuring the scheduler alone.
    enabled: bool = True


class TelemetryConfig(_Strict):
    """The job-side launcher (``mlops-gpu exec``) every backend wraps a run's command in."""

    #: Wrap commands in the launcher (GPU samples to MLflow, idle detection, signal passing).
    launcher: bool = True
    #: Seconds between GPU samples.
    interval_s: float = Field(10.0, ge=0.1)
    #: A sample is idle when every one of the run's GPUs is under this utilization (percent).
    idle_below_pct: float = Field(1.0, ge=0, le=100)
    #: Seconds of idle samples before the run is flagged idle (its GPU time from then on, the
    #: window included, counts as wasted); null: never flag.
    idle_after_s: float | None = Field(1800.0, gt=0)
    #: Stop a run flagged idle (SIGTERM, as a cancel), rather than only flag it.
    stop_idle: bool = False


class PolicyConfig(_Strict):
    name: Literal["default"] = "default"
    queueing: Literal["best-effort-fifo", "strict-fifo"] = "best-effort-fifo"
    #: Within a priority class and project: ``shortest`` (shortest ``max_runtime`` first;
    #: runs without one last), ``submit`` order, or ``las`` (least attained GPU-service first,
    #: levels split at ``las_thresholds_gpu_s``).
    order: Literal["shortest", "submit", "las"] = "shortest"
    #: Under ``shortest``: a run preempts a run of its own project and class only when that
    #: run is expected to go on for more than this many times the new run's max_runtime.
    shortest_preempt_ratio: float = Field(8.0, ge=1)
    #: Under ``shortest``: that preemption also takes such a run of another project of the
    #: cohort that borrows the GPU type, when that project's fair share is more than
    #: ``borrower_share_ratio`` times the new run's project's (both engines).
    shortest_preempt_borrowers: bool = False
    borrower_share_ratio: float = Field(1.0, ge=1)
    #: A run of the preemptor's own project and class is preempted only after running this
    #: many seconds (a guaranteed minimum runtime; lower classes and reclaim ignore it).
    min_runtime_before_preemption_s: float = Field(600.0, ge=0)
    #: Whether a same-class run that has not reported a checkpoint may be preempted.
    preempt_uncheckpointed: bool = False
    las_thresholds_gpu_s: list[float] = Field(default_factory=lambda: [3600.0, 36000.0])
    fair_share: bool = True
    #: Half-life of past usage in the fair-share order, seconds.
    half_life_s: float = Field(3600.0, gt=0)
    preemption: bool = True
    backfill: bool = True
    #: ``fragmentation`` (FGD-style, where GPUs are shared or nodes track CPU/memory) or
    #: ``best-fit``.
    placement: Literal["fragmentation", "best-fit"] = "fragmentation"


class RetryConfig(_Strict):
    max_attempts: int = Field(3, ge=1)
    #: A requeued run waits backoff_s * 2^(attempt - 2) seconds, at most backoff_max_s.
    backoff_s: float = Field(10.0, ge=0)
    backoff_max_s: float = Field(600.0, ge=0)

    def backoff(self, next_attempt: int) -> float:
        return float(min(self.backoff_s * 2 ** max(next_attempt - 2, 0), self.backoff_max_s))


class SchedulerConfig(_Strict):
    tick_s: float = Field(1.0, gt=0, le=60)
    #: Between ticks the daemon checks the store revision this often and ticks at once when a
    #: run was submitted or cancelled, so a submit does not wait for the next tick (0: off).
    wake_s: float = Field(0.05, ge=0, le=60)
    #: Reasons and ETAs of a queue over 1,000 pending runs are recomputed and stored at most
    #: this often (a full pass over the queue; admission does not wait for it). Shorter queues
    #: are explained every tick.
    explain_s: float = Field(5.0, ge=0, le=600)
    #: An auto-started scheduler (SDK) exits after this long with nothing pending or running.
    idle_exit_s: float = Field(300.0, gt=0)
    #: The leader's lease in the store: renewed every tick; a scheduler that has not renewed
    #: it for this long (paused, hung, on a lost host) may be replaced, and is then fenced.
    #: Default (null): 30 s, or 3 ticks when longer.
    lease_s: float | None = Field(None, ge=2, le=3600)

    @property
    def lease(self) -> float:
        return self.lease_s if self.lease_s is not None else max(30.0, 3 * self.tick_s)

    @model_validator(mode="after")
    def _lease_outlasts_ticks(self) -> SchedulerConfig:
        # the lease is renewed once a tick: one barely longer than a tick would lapse between
        # two renewals of a healthy scheduler, and the next submit would start a rival
        if self.lease_s is not None and self.lease_s < 3 * self.tick_s:
            raise ValueError(
                f"lease_s ({self.lease_s:g}) must be at least 3 x tick_s ({self.tick_s:g})"
            )
        return self


class Config(_Strict):
    store: str = "sqlite:///state.db"
    state_dir: str = "state"
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    gpu_types: dict[str, GpuTypeConfig] = Field(min_length=1)
    backends: dict[str, BackendConfig] = Field(min_length=1)
    cohorts: dict[str, CohortConfig] = Field(default_factory=dict)
    projects: dict[str, ProjectConfig] = Field(min_length=1)
    priority_classes: dict[str, int] = Field(
        default_factory=lambda: {"low": 0, "normal": 100, "high": 1000}, min_length=1
    )
    default_priority: str = "normal"
    #: The most elements one ``submit --array`` may create.
    max_array_size: int = Field(10_000, ge=1)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    #: Elastic node pools (``config.pools``): used by ``simulate --autoscale`` only, for now.
    pools: dict[str, PoolConfig] = Field(default_factory=dict)

    _root: Path = PrivateAttr(default_factory=Path.cwd)
    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _references(self) -> Config:
        errors: list[str] = []
        # names the store keeps in columns of bounded width (``state.schema``)
        for section, names, most in (
            ("gpu_types", self.gpu_types, 100),
            ("backends", self.backends, 100),
            ("priority_classes", self.priority_classes, 100),
            ("projects", self.projects, 200),
        ):
            for name in names:
                if len(name) > most:
                    errors.append(f"{section}: a name of {len(name)} characters (at most {most})")
        for pname, p in self.projects.items():
            if p.cohort is not None and p.cohort not in self.cohorts:
                errors.append(f"projects.{pname}.cohort: unknown cohort {p.cohort!r}")
            for t in p.quotas:
                if t not in self.gpu_types:
                    errors.append(f"projects.{pname}.quotas.{t}: unknown GPU type {t!r}")
        for cname, c in self.cohorts.items():
            if c.parent is not None and c.parent not in self.cohorts:
                errors.append(f"cohorts.{cname}.parent: unknown cohort {c.parent!r}")
        for cname in self.cohorts:  # the cohort tree must not loop
            seen, cur = {cname}, self.cohorts[cname].parent
            while cur is not None and cur in self.cohorts:
                if cur in seen:
                    errors.append(f"cohorts.{cname}.parent: the cohort tree loops through {cur}")
                    break
                seen.add(cur)
                cur = self.cohorts[cur].parent
        node_names: set[str] = set()
        for bname, b in self.backends.items():
            for i, n in enumerate(b.config_nodes()):
                if n.gpu_type not in self.gpu_types:
                    errors.append(
                        f"backends.{bname}.nodes.{i}.gpu_type: unknown GPU type {n.gpu_type!r}"
                    )
                if n.name in node_names:
                    errors.append(f"backends.{bname}.nodes.{i}.name: duplicate node {n.name!r}")
                node_names.add(n.name)
        for pname, proj in self.projects.items():
            budget = proj.budget
            lower_to = budget.lower_to if budget is not None else None
            if lower_to is not None and lower_to not in self.priority_classes:
                errors.append(
                    f"projects.{pname}.budget.lower_to: {lower_to!r} is not a priority class"
                )
        errors.extend(pool_errors(self.pools, self.backends, self.gpu_types))
        if self.default_priority not in self.priority_classes:
            errors.append(
                f"default_priority: {self.default_priority!r} is not one of priority_classes"
            )
        if errors:
            raise ValueError("; ".join(errors))
        return self

    # -- paths ----------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self._root

    @property
    def source(self) -> Path | None:
        return self._source

    def bind(self, source: Path | None, root: Path) -> Config:
        self._source, self._root = source, root
        return self

    @property
    def store_url(self) -> str:
        """The store URL with a relative SQLite path resolved against the config's folder."""
        prefix = "sqlite:///"
        if self.store.startswith(prefix) and not self.store.startswith(prefix + "/"):
            rest = self.store[len(prefix) :]
            if rest and rest != ":memory:":
                return prefix + str((self._root / rest).resolve())
        return self.store

    @property
    def state_path(self) -> Path:
        p = Path(self.state_dir).expanduser()
        return p if p.is_absolute() else (self._root / p).resolve()

    def resolve_path(self, path: str) -> Path:
        """A path from the config: ``~`` expanded, relative to the config file's folder."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self._root / p).resolve()

    def tracking_uri(self, environ: dict[str, str]) -> str:
        """Config, else ``MLFLOW_TRACKING_URI``, else a SQLite store beside the state."""
        uri = self.mlflow.tracking_uri or environ.get("MLFLOW_TRACKING_URI")
        if uri:
            if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
                return "sqlite:///" + str((self._root / uri[len("sqlite:///") :]).resolve())
            return uri
        return "sqlite:///" + str(self.state_path / "mlflow.db")

    def artifact_root(self, tracking_uri: str) -> str | None:
        """Where experiments the scheduler creates keep their artifacts: ``mlflow.artifact_root``
        (a path becomes a file URI), else ``<state_dir>/mlartifacts`` for a local store (never
        ``./mlruns`` of whatever folder the scheduler runs in), else None (the server's)."""
        root = self.mlflow.artifact_root
        if root and "://" in root:
            return root
        if root:
            return self.resolve_path(root).as_uri()
        if tracking_uri.startswith(("http://", "https://")):
            return None
        return (self.state_path / "mlartifacts").as_uri()

    # -- model values ---------------------------------------------------------------------
    def model_projects(self) -> dict[str, Project]:
        return {name: self._project(name, p) for name, p in self.projects.items()}

    @staticmethod
    def _project(name: str, p: ProjectConfig) -> Project:
        b = p.budget
        return Project(
            name=name,
            cohort=p.cohort,
            weight=p.weight,
            quotas=MappingProxyType(
                {
                    t: Quota(q.nominal, q.borrowing_limit, q.lending_limit)
                    for t, q in p.quotas.items()
                }
            ),
            budget=None
            if b is None
            else Budget(b.window_s, b.gpu_hours, b.usd, b.action, b.lower_to),
        )

    def model_cohorts(self) -> dict[str, Cohort]:
        return {name: Cohort(name, c.parent) for name, c in self.cohorts.items()}

    def model_gpu_types(self) -> dict[str, GpuType]:
        return {n: GpuType(n, t.price_per_hour, t.memory_gb) for n, t in self.gpu_types.items()}

    def model_nodes(self, backend: str) -> list[Node]:
        b = self.backends[backend]
        return [
            Node(
                name=n.name,
                backend=backend,
                gpu_type=n.gpu_type,
                devices=n.device_ids(),
                labels=MappingProxyType(dict(n.labels)),
                mig=MappingProxyType({k: tuple(v) for k, v in n.mig.items()}),
                shared=n.shared,
                gpu_memory_mb=n.gpu_memory_mb,
                cpu_milli=n.cpu_milli,
                host_memory_mb=n.host_memory_mb,
            )
            for n in b.config_nodes()
        ]

    def policy_settings(self) -> PolicySettings:
        p = self.policy
        return PolicySettings(
            name=p.name,
            queueing=p.queueing,
            order=p.order,
            shortest_preempt_ratio=p.shortest_preempt_ratio,
            shortest_preempt_borrowers=p.shortest_preempt_borrowers,
            borrower_share_ratio=p.borrower_share_ratio,
            min_runtime_before_preemption_s=p.min_runtime_before_preemption_s,
            preempt_uncheckpointed=p.preempt_uncheckpointed,
            las_thresholds_gpu_s=tuple(sorted(p.las_thresholds_gpu_s)),
            fair_share=p.fair_share,
            half_life_s=p.half_life_s,
            preemption=p.preemption,
            backfill=p.backfill,
            placement=p.placement,
        )
