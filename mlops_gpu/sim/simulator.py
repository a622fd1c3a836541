"""A discrete-event simulator: the real core on a virtual clock, with a fake backend that
"runs" a job for its trace duration.

The engine is the native one (``engines.native``: the policy in Rust) where it is installed (it
takes every policy and every job of a trace), else the Python reference
(``engines.reference.FromScratch``: the same decisions, a snapshot per cycle); ``engine``: ``auto``,
``reference`` (``python``, its former name, is accepted) or ``native``, which insists.

Each event time (arrivals, completions) runs one scheduling cycle, and another at once while a
cycle preempts. Preemption as the controller applies it: a decision that preempts admits the
preemptor too, on the devices its victims free; the victims stop (instantly here: the simulated
grace is 0), and the preemptor starts once they have exited (at once, then). The preemption
model of BENCHMARKS.md: jobs are preemptible and checkpoint every ``CHECKPOINT_S`` seconds of
progress, which they report (``engine.checkpoint``, before each cycle: what a same-class
preemption asks of its victim, with the minimum runtime; cycles run at arrivals and
completions only, so such a preemption waits for the next of them); a preempted job keeps its
checkpointed progress, loses the rest, and pays ``RESTART_S`` of overhead when it starts
again. ``max_runtime`` (what backfill and ETAs use) is 2 x the true
remaining time plus the restart overhead, as the pinned references require (1 x for the
``srtf-oracle``, which knows durations).

ETAs: after the cycles of an event time, when one of about ``ETA_SAMPLE`` sampled jobs has just
become a waiting run, or a simulated hour has passed while one waits, the engine explains the
queue (``explain_all``: the same reasons and ETAs with either engine) and ``sim.eta``
records what the sampled runs were told.

Fair share reads the decayed usage of finished attempts (``controller.accounting`` computes it
the same way from the ledger in production) plus current allocation.

Invariants: every job is submitted once; a job is active in at most one attempt; a finished
job's progress equals its duration; the allocation segments are exactly the attempts.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol, cast

from mlops_gpu.core.fairshare import decayed
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.engines import native
from mlops_gpu.engines.gated import Gated
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import (
    BackendCapabilities,
    Cohort,
    GpuType,
    Node,
    Phase,
    Project,
    Quota,
    ResourceRequest,
    Run,
    RunSpec,
)
from mlops_gpu.model.run import CheckpointPolicy
from mlops_gpu.sim.engines import core_engine
from mlops_gpu.sim.eta import EtaLog, EtaRecord
from mlops_gpu.sim.policies import Preset, preset
from mlops_gpu.sim.trace import Trace, TraceJob

CHECKPOINT_S = 1800.0
RESTART_S = 60.0
DEFAULT_GPU_TYPE = "gpu"
POOL = "all"
CLASSES = {"low": 50, "normal": 100, "high": 200}
#: about how many jobs of a trace have their ETAs recorded: each record needs the core's
#: explanation of the whole queue, which costs more than the cycle itself
ETA_SAMPLE = 500


@dataclass(frozen=True)
class Cluster:
    """``nodes`` x ``gpus_per_node`` GPUs of one type, or the trace's own ``node_list``."""

    nodes: int
    gpus_per_node: int
    gpu_type: str = DEFAULT_GPU_TYPE
    node_list: tuple[Node, ...] = ()

    @property
    def gpus(self) -> int:
        if self.node_list:
            return sum(n.capacity for n in self.node_list)
        return self.nodes * self.gpus_per_node

    def model_nodes(self) -> tuple[Node, ...]:
        if self.node_list:
            return self.node_list
        devices = tuple(str(d) for d in range(self.gpus_per_node))
        return tuple(Node(f"sim-{i:04d}", "sim", self.gpu_type, devices) for i in range(self.nodes))

    def capacity_by_type(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for n in self.model_nodes():
            out[n.gpu_type] += n.capacity
        return dict(sorted(out.items()))


@dataclass
class JobOutcome:
    job: TraceJob
    first_start: float | None = None
    finish: float | None = None
    attempts: int = 0
    preempted: int = 0
    lost_gpu_s: float = 0.0


@dataclass
class SimResult:
    policy: str
    trace: Trace
    cluster: Cluster
    nominal: dict[str, int]
    outcomes: list[JobOutcome]
    #: (trace project, start, end, GPUs): one per attempt
    segments: list[tuple[str, float, float, float]]
    quota_violations: int | None
    cycles: int
    cycle_wall_s: float
    wall_s: float
    unfinished: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    #: ``reference`` or ``native``: which engine made the decisions (the same ones either way)
    engine: str = "reference"
    #: Jobs cancelled because a dependency could never be met (job control traces)
    cancelled: int = 0
    #: per run that waited: the ETAs it was given (``sim.eta``)
    etas: dict[str, EtaRecord] = field(default_factory=dict)

    @property
    def preemptions(self) -> int:
        return sum(o.preempted for o in self.outcomes)


def nominal_quotas(trace: Trace, gpus: int) -> dict[str, int]:
    """Whole-GPU nominal quotas in proportion to the trace's weights, summing to at most
    ``gpus`` (largest remainder). Without weights, equal shares."""
    weights = {p: trace.weights.get(p, 0.0) for p in trace.projects}
    if not any(weights.values()):
        weights = dict.fromkeys(trace.projects, 1.0)
    total = sum(weights.values())
    exact = {p: gpus * w / total for p, w in weights.items()}
    out = {p: math.floor(x) for p, x in exact.items()}
    left = gpus - sum(out.values())
    for p in sorted(exact, key=lambda p: (out[p] - exact[p], p))[:left]:
        out[p] += 1
    return out


def template(trace: Trace, cluster: Cluster, p: Preset) -> tuple[Snapshot, dict[str, int]]:
    """The core's template for ``cluster``; nominal quotas per project (all types summed).
    Each GPU type's capacity is shared out by the trace's weights (``nominal_quotas``)."""
    nodes = cluster.model_nodes()
    by_type = cluster.capacity_by_type()
    per_type = {t: nominal_quotas(trace, cap) for t, cap in by_type.items()}
    nominal = {name: sum(q[name] for q in per_type.values()) for name in trace.projects}
    projects: dict[str, Project] = {}
    if not p.quotas:
        pool = {t: Quota(cap, 0) for t, cap in by_type.items()}
        projects[POOL] = Project(POOL, quotas=MappingProxyType(pool))
    else:
        for name, n in nominal.items():
            quotas = {
                t: Quota(cap, 0) if p.unlimited else Quota(per_type[t][name], None)
                for t, cap in by_type.items()
            }
            projects[name] = Project(
                name,
                cohort=None if p.unlimited else "cluster",
                weight=float(max(n, 1)),
                quotas=MappingProxyType(quotas),
            )
    classes = dict(CLASSES)
    for job in trace.jobs:
        if job.priority not in classes:
            classes[job.priority] = _class_value(job.priority)
    snap = Snapshot(
        now=0.0,
        nodes=nodes,
        pending=(),
        active=(),
        projects=projects,
        gpu_types={t: GpuType(t, 0.0) for t in by_type},
        priority_classes=classes,
        cohorts={"cluster": Cohort("cluster")} if p.quotas and not p.unlimited else {},
        policy=p.settings,
        capabilities={
            "sim": BackendCapabilities(multi_node=True, shared_gpus=any(n.shared for n in nodes))
        },
    )
    return snap, nominal


def _class_value(name: str) -> int:
    try:
        return int(name)
    except ValueError:
        raise ValueError(
            f"trace priority {name!r}: expected low, normal, high or an integer"
        ) from None


@dataclass
class _Attempt:
    start: float
    overhead: float
    gpu_type: str


class _Checkpoints(Protocol):
    def checkpoint(self, run_id: str, at: float) -> None: ...


class Simulation:
    def __init__(self, trace: Trace, cluster: Cluster, policy: str, engine: str = "auto") -> None:
        self.trace, self.cluster = trace, cluster
        self.preset = preset(policy)
        self.template, self.nominal = template(trace, cluster, self.preset)
        self.jobs = {j.id: j for j in trace.jobs}
        self.out = {j.id: JobOutcome(j) for j in trace.jobs}
        self.remaining = {j.id: j.duration_s for j in trace.jobs}
        #: GPU-seconds held over earlier attempts, lost work included (what LAS orders by,
        #: as ``Run.attained_gpu_s`` in production)
        self.attained: dict[str, float] = defaultdict(float)
        # job control (arrays, dependencies) in front of either engine (``engines.gated``)
        self.engine = Gated(self._engine(engine))
        self.cancelled: set[str] = set()  # jobs whose dependencies could never be met
        self.running: dict[str, _Attempt] = {}
        self.ends: list[tuple[float, int, str]] = []
        #: (next checkpoint, attempt, job) of each running attempt, reported before each cycle
        self.checkpoints: list[tuple[float, int, str]] = []
        self.segments: list[tuple[str, float, float, float]] = []
        self.history: dict[tuple[str, str], float] = defaultdict(float)
        self.history_at = 0.0
        self.violations = 0
        self.cycles, self.cycle_s = 0, 0.0
        self.etas = EtaLog()
        #: ETAs are recorded for every ``eta_every``-th job of the trace (``ETA_SAMPLE``)
        self.eta_every = max(1, -(-len(trace.jobs) // ETA_SAMPLE))

    def _engine(self, choice: str) -> FromScratch | native.NativeEngine:
        missing = (
            f"policy {self.preset.name}: the native engine is not installed "
            "(mlops_gpu._engine: reinstall mlops-gpu where cargo, Rust 1.82 or later, is on PATH)"
        )
        return core_engine(self.template, choice, missing)

    def _run_for(self, job: TraceJob, seq: int, attempt: int, overhead: float, now: float) -> Run:
        project = job.project if self.preset.quotas else POOL
        spec = RunSpec(
            name=job.id,
            project=project,
            user="sim",
            command=("sim",),
            request=ResourceRequest(
                job.gpus,
                job.nodes,
                job.accepts,
                gpu_fraction=job.gpu_fraction,
                cpu_milli=job.cpu_milli,
                host_memory_mb=job.host_memory_mb,
            ),
            priority=job.priority,
            max_runtime_s=self.preset.estimate_factor * (self.remaining[job.id] + overhead),
            checkpoint=CheckpointPolicy(grace_s=0.0),
            dependencies=job.dependencies,
            array_id=job.array_id,
            array_limit=job.array_limit,
        )
        return Run(
            job.id,
            seq,
            spec,
            Phase.PENDING,
            attempt,
            job.submit_s,
            attained_gpu_s=self.attained[job.id],
        )

    # Hooks for simulations that change the cluster (``sim.autoscale``): the next time they
    # want a cycle, and what they do around each event time's cycles.
    def _next_event(self) -> float:
        return math.inf

    def _before_cycles(self, now: float) -> None:
        pass

    def _after_cycles(self, now: float) -> None:
        pass

    def _decay(self, now: float) -> None:
        h = max(self.preset.settings.half_life_s, 1.0)
        if now > self.history_at:
            f = 2.0 ** (-(now - self.history_at) / h)
            for k in self.history:
                self.history[k] *= f
        self.history_at = now

    def _stop(self, job_id: str, now: float) -> None:
        """Book the attempt's segment and its decayed usage (it ends now)."""
        att = self.running.pop(job_id)
        job = self.jobs[job_id]
        self.segments.append((job.project, att.start, now, job.total_gpus))
        h = max(self.preset.settings.half_life_s, 1.0)
        project = job.project if self.preset.quotas else POOL
        self.history[(project, att.gpu_type)] += decayed(job.total_gpus, att.start, now, now, h)

    def _report_checkpoints(self, now: float) -> None:
        """Tell the engine of the checkpoints running attempts have made by ``now`` (the
        latest of each: every ``CHECKPOINT_S`` of progress after the restart overhead)."""
        while self.checkpoints and self.checkpoints[0][0] <= now:
            _, attempt, jid = heapq.heappop(self.checkpoints)
            att = self.running.get(jid)
            if att is None or self.out[jid].attempts != attempt:
                continue  # that attempt ended
            done = math.floor((now - att.start - att.overhead) / CHECKPOINT_S)
            # (the native engine is chosen only where it has ``checkpoint``: ``_engine``)
            cast(_Checkpoints, self.engine).checkpoint(
                jid, att.start + att.overhead + done * CHECKPOINT_S
            )
            nxt = att.start + att.overhead + (done + 1) * CHECKPOINT_S
            heapq.heappush(self.checkpoints, (nxt, attempt, jid))

    def _cycle(self, now: float) -> int:
        self._decay(now)
        self._report_checkpoints(now)
        t0 = time.perf_counter()
        d = self.engine.cycle(now, dict(self.history))
        self.cycle_s += time.perf_counter() - t0
        self.cycles += 1
        for gone in d.doomed:  # as the controller does: cancelled, an end for their dependents
            self.engine.remove_pending(gone.run_id)
            self.engine.ended(gone.run_id, Phase.CANCELLED)
            self.cancelled.add(gone.run_id)
        for p in d.preemptions:  # the victims exit (grace 0) before their preemptors start
            self._preempted(p.run_id, now)
        for a in d.admissions:
            job = self.jobs[a.run_id]
            o = self.out[job.id]
            overhead = RESTART_S if o.attempts else 0.0
            o.attempts += 1
            if o.first_start is None:
                o.first_start = now
                self.etas.started(job.id)
            self.running[job.id] = _Attempt(now, overhead, a.placement.gpu_type)
            heapq.heappush(self.ends, (now + overhead + self.remaining[job.id], o.attempts, job.id))
            first = now + overhead + CHECKPOINT_S
            heapq.heappush(self.checkpoints, (first, o.attempts, job.id))

        self._check_quota()
        return len(d.preemptions)

    def _preempted(self, job_id: str, now: float) -> None:
        job, o = self.jobs[job_id], self.out[job_id]
        att = self.running[job_id]
        progress = max(now - att.start - att.overhead, 0.0)
        kept = min(math.floor(progress / CHECKPOINT_S) * CHECKPOINT_S, self.remaining[job_id])
        self.remaining[job_id] -= kept
        o.preempted += 1
        o.lost_gpu_s += (now - att.start - kept) * job.total_gpus
        self.attained[job_id] += (now - att.start) * job.total_gpus
        self._stop(job_id, now)
        victim = self.engine.finish(job_id)
        self.engine.submit(
            replace(
                self._run_for(job, victim.seq, victim.attempt + 1, RESTART_S, now),
                submitted_at=victim.submitted_at,
            )
        )

    def _check_quota(self) -> None:
        if not self.preset.quotas or self.preset.unlimited:
            return
        used = self.engine.used
        for name, proj in self.template.projects.items():
            for t in self.template.gpu_types:
                q = proj.quota(t)
                limit = math.inf if q.borrowing_limit is None else q.nominal + q.borrowing_limit
                if used[(name, t)] > limit + 1e-9:
                    self.violations += 1

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        t_start = time.perf_counter()
        jobs = self.trace.jobs
        i, n, done = 0, len(jobs), 0
        step, reported = max(1, n // 20), -1  # report every 5% of jobs finished
        while True:
            t_next = min(
                jobs[i].submit_s if i < n else math.inf,
                self.ends[0][0] if self.ends else math.inf,
                self._next_event(),
            )
            if t_next == math.inf:
                break
            now = t_next
            while self.ends and self.ends[0][0] <= now:
                _, attempt, jid = heapq.heappop(self.ends)
                if jid in self.running and self.out[jid].attempts == attempt:
                    self.remaining[jid] = 0.0
                    self.out[jid].finish = now
                    self._stop(jid, now)
                    self.engine.finish(jid)
                    self.engine.ended(jid, Phase.SUCCEEDED)
                    done += 1
            arrived = i
            while i < n and jobs[i].submit_s <= now:
                self.engine.submit(self._run_for(jobs[i], i, 1, 0.0, now))
                i += 1
            self._before_cycles(now)
            for _ in range(10):  # victims exit at once: cycle again for the runs they made room for
                if not self._cycle(now):
                    break
            self._after_cycles(now)
            waits = [
                j.id
                for k, j in enumerate(jobs[arrived:i], arrived)
                if k % self.eta_every == 0 and self.out[j.id].first_start is None
            ]
            if self.etas.due(now, waits):  # what the controller explains after its tick
                self.etas.record(now, waits, self.engine.explain_all(now, dict(self.history)))
            if progress is not None and done // step > reported:
                reported = done // step
                progress(done, n)
        return SimResult(
            policy=self.preset.name,
            trace=self.trace,
            cluster=self.cluster,
            nominal=self.nominal,
            outcomes=list(self.out.values()),
            segments=self.segments,
            quota_violations=self.violations
            if self.preset.quotas and not self.preset.unlimited
            else None,
            cycles=self.cycles,
            cycle_wall_s=self.cycle_s,
            wall_s=time.perf_counter() - t_start,
            unfinished=sum(
                1 for o in self.out.values() if o.finish is None and o.job.id not in self.cancelled
            ),
            cancelled=len(self.cancelled),
            engine="native" if isinstance(self.engine.inner, native.NativeEngine) else "reference",
            etas=self.etas.records,
        )


def simulate(
    trace: Trace,
    cluster: Cluster,
    policy: str = "default",
    progress: Callable[[int, int], None] | None = None,
    engine: str = "auto",
) -> SimResult:
    """Replay ``trace`` on ``cluster`` under ``policy`` (a name of ``sim.policies.PRESETS``)
    with ``engine`` (``engines.ENGINES``)."""
    return Simulation(trace, cluster, policy, engine).run(progress)
