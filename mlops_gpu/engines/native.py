"""The native engine: the reference's decisions (``engine.FromScratch``), made by a Rust extension.

``NativeEngine`` has ``FromScratch``'s interface (``submit``, ``finish``, ``checkpoint``,
``cycle``, ``explain_all``, ``pending``, ``active``, ``set_nodes``) and makes the same
admissions, placements and preemptions (each with its preemptor admitted in the same decision
and the victim's lost GPU-seconds), in the same order; ``tests/test_native_core.py`` compares
them cycle by cycle on random workloads, and ``benchmarks/core_throughput.py --core native``
on the full benchmark.

It takes every config the Python engine takes (``native_support.unsupported`` names only a
``policy.borrower_share_ratio`` below 1, which the config refuses; ``NotSupported`` is raised
for it and where the extension is not installed); it takes every active run,
booked as ``core.held.as_held`` says (a node, GPU type or project gone from the config).
Runs with an unknown project or class wait (as ``invalid``) and runs in backoff wait here until
their ``not_before``, as in ``State``. A cycle's decision carries no pending reasons: the
extension explains the same state on demand (``explain_all``: codes, parameters and ETAs from
Rust, sentences rendered by ``native_explain`` from ``reason_text``, the Python core's table).

The extension is the module ``mlops_gpu._engine``: the PyO3 crate ``native/py`` over the Rust
library crate ``native/``, built by the ordinary install (``pip install .`` or ``-e .``, through
setuptools-rust) where cargo exists; without cargo the install succeeds without it.
``installed()`` imports it (None where it is missing; ``PYTHON_ENGINE_WARNING`` says what that
costs). Settings and runs cross into it as its typed classes (``_engine.Settings``,
``_engine.RunSpec``, ...; ``mlops_gpu/_engine.pyi``), decisions come back as
``_engine.Admitted`` and ``_engine.Preempted``.

Invariant: the indices given to the extension number GPU types, backends, nodes and projects
in the sorted order of their names (the Python core breaks its ties by name), so that index
order is name order there.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import replace
from types import ModuleType

from mlops_gpu.core import borrowers
from mlops_gpu.core.decision import Admission, Decision, PendingReason, Preemption
from mlops_gpu.core.held import as_held
from mlops_gpu.core.quota import cohort_roots
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.engines import native_explain, native_nodes, native_objects, native_support
from mlops_gpu.engines.native_support import NotSupported, unsupported
from mlops_gpu.engines.run_copy import going, running
from mlops_gpu.model import NodeSlot, Placement, Run
from mlops_gpu.model.cluster import mig_share

MODULE = "mlops_gpu._engine"

try:
    import mlops_gpu._engine as _engine
except ModuleNotFoundError as e:  # not built (no cargo at install): the Python engine serves
    if e.name != MODULE:  # it is there but needs something missing: say so
        raise
    _engine = None  # type: ignore[assignment]

NOT_INSTALLED = f"the Rust engine ({MODULE}) is not installed"
#: What the scheduler logs once where the Rust engine is missing (``controller.mirror``).
PYTHON_ENGINE_WARNING = (
    f"{NOT_INSTALLED}, so the scheduler runs the Python engine: the same decisions at about "
    "45 admissions/s instead of about 11,000 at 100 nodes and 5,000 queued runs "
    "(benchmarks/RESULTS.md). To build it, install Rust (cargo 1.82 or later) and reinstall "
    "mlops-gpu (pip install -e . or pip install .)"
)


def installed() -> ModuleType | None:
    """The Rust engine's module (``mlops_gpu._engine``), or None where the install built none
    (no cargo)."""
    return _engine


__all__ = ["NativeEngine", "NotSupported", "installed", "unsupported"]

# The cycle's result objects, built as their dataclasses build them at about half the cost
# (``native_objects``: every field given, in order)
_NODE_SLOT = native_objects.build(NodeSlot)
_PLACEMENT = native_objects.build(Placement)
_ADMISSION = native_objects.build(Admission)
_PREEMPTION = native_objects.build(Preemption)
_DECISION = native_objects.build(Decision)


class NativeEngine:
    """``engine.FromScratch`` with the cycle in Rust (see the module docstring)."""

    set_nodes = native_nodes.set_nodes  # capacity changed: rebuilt around the nodes, same runs

    def __init__(self, template: Snapshot, module: ModuleType | None = None) -> None:
        """``module``: the extension, as ``installed()`` returns it (the default)."""
        if _engine is None:
            raise NotSupported(NOT_INSTALLED)
        if module is not None and module is not _engine:
            raise ValueError(f"module: expected {MODULE}, got {module.__name__}")
        why = unsupported(template)
        if why is not None:
            raise NotSupported(why)
        self.template = template
        self.pending: dict[str, Run] = {}
        self.active: dict[str, Run] = {}
        self._backoff: list[tuple[float, int, str]] = []
        self._queued: set[str] = set()  # the pending runs in the extension's queues
        self._outside: set[str] = set()  # active runs the extension does not hold (``held``)
        self._now = template.now
        self.types = sorted({n.gpu_type for n in template.nodes})
        self._type_ix = {t: i for i, t in enumerate(self.types)}
        self.backends = sorted({n.backend for n in template.nodes})
        self._backend_ix = backend_ix = {b: i for i, b in enumerate(self.backends)}
        nodes = sorted(template.nodes, key=lambda n: n.name)
        self._node_ix = {n.name: i for i, n in enumerate(nodes)}
        self._nodes = nodes
        self._by_name = {n.name: n for n in nodes}
        self._node_names = [n.name for n in nodes]
        # MIG profiles numbered in name order; each node's device numbers: its whole devices,
        # then its MIG slices, profile after profile (``_engine.PartSpec``)
        self._profiles = sorted({p for n in nodes for p in n.mig})
        self._profile_ix = {p: i for i, p in enumerate(self._profiles)}
        self._dev_names = [(*n.devices, *(s for ids in n.mig.values() for s in ids)) for n in nodes]
        # topology keys, and each key's values, numbered in name order
        self._keys = sorted({k for n in nodes for k in n.labels})
        self._key_ix = {k: i for i, k in enumerate(self._keys)}
        self._unknown_keys: dict[str, int] = {}
        values = [sorted({n.labels[k] for n in nodes if k in n.labels}) for k in self._keys]
        value_ix = [{v: i for i, v in enumerate(vs)} for vs in values]
        self.projects = sorted(template.projects)
        self._budgeted = [p for p in self.projects if template.projects[p].budget is not None]
        self._project_ix = {p: i for i, p in enumerate(self.projects)}
        roots = cohort_roots(template)
        root_names = sorted({r for r in roots.values() if r is not None})
        root_ix = {r: i for i, r in enumerate(root_names)}
        members: list[list[int]] = [[] for _ in root_names]
        for name in template.projects:  # the snapshot's project order
            root = roots[name]
            if root is not None:
                members[root_ix[root]].append(self._project_ix[name])
        e = _engine
        projects = []
        for name in self.projects:
            proj = template.projects[name]
            quotas = []
            for t in self.types:
                q = proj.quota(t)
                quotas.append(
                    e.QuotaSpec(
                        nominal=float(q.nominal),
                        borrowing_limit=None
                        if q.borrowing_limit is None
                        else float(q.borrowing_limit),
                        lending_limit=None if q.lending_limit is None else float(q.lending_limit),
                    )
                )
            root = roots[name]
            projects.append(
                e.ProjectSpec(
                    weight=proj.weight,
                    root=None if root is None else root_ix[root],
                    quotas=quotas,
                )
            )
        # one more, no quota, no cohort: the project of active runs the config no longer names
        # (``held.as_held``: what they hold there is nobody's to read)
        none = e.QuotaSpec(nominal=0.0, borrowing_limit=None, lending_limit=None)
        projects.append(e.ProjectSpec(weight=1.0, root=None, quotas=[none] * len(self.types)))
        capacity = [0.0] * len(self.types)
        of_type: list[list[int]] = [[] for _ in self.types]
        for n in template.nodes:  # the snapshot's node order (``eligible_nodes``)
            # (with MIG slices' shares, summed as ``Capacity.capacity_by_type`` does)
            mig = sum((len(ids) * mig_share(p) for p, ids in n.mig.items()), 0.0)
            capacity[self._type_ix[n.gpu_type]] += n.capacity + mig
            of_type[self._type_ix[n.gpu_type]].append(self._node_ix[n.name])
        p = template.policy
        self._engine = e.Engine(
            e.Settings(
                n_types=len(self.types),
                nodes=[
                    e.NodeSpec(
                        gpu_type=self._type_ix[n.gpu_type],
                        backend=backend_ix[n.backend],
                        devices=n.capacity,
                        schedulable=n.schedulable,
                        cpu_milli=n.cpu_milli,
                        host_memory_mb=n.host_memory_mb,
                        labels=[
                            value_ix[i].get(n.labels[k]) if k in n.labels else None
                            for i, k in enumerate(self._keys)
                        ],
                    )
                    for n in nodes
                ],
                multi_node=[template.caps(b).multi_node for b in self.backends],
                projects=projects,
                members=members,
                capacity_by_type=capacity,
                of_type=of_type,
                policy=e.PolicySpec(
                    order=p.order,
                    las_thresholds_gpu_s=[float(x) for x in p.las_thresholds_gpu_s],
                    strict_fifo=p.queueing == "strict-fifo",
                    fair_share=p.fair_share,
                    half_life_s=float(p.half_life_s),
                    preemption=p.preemption,
                    backfill=p.backfill,
                    shortest_preempt_ratio=float(p.shortest_preempt_ratio),
                    min_runtime_before_preemption_s=float(p.min_runtime_before_preemption_s),
                    preempt_uncheckpointed=p.preempt_uncheckpointed,
                    placement=p.placement,
                    shortest_preempt_borrowers=p.shortest_preempt_borrowers,
                    borrower_share_ratio=float(p.borrower_share_ratio),
                ),
                parts=native_nodes.part_specs(self, template, e),
                shape_prior=[
                    e.PriorShape(
                        gpus=gpus,
                        share=share,
                        cpu_milli=cpu,
                        host_memory_mb=mem,
                        accepts=list(accepts),
                        gpu_types=[i for i, t in enumerate(self.types) if t in accepts],
                        count=count,
                    )
                    for (gpus, share, cpu, mem, accepts), count in template.shape_prior.items()
                ],
            )
        )

    # -- events -------------------------------------------------------------------------
    def submit(self, run: Run) -> None:
        t = self.template
        self.pending[run.id] = run
        if run.project not in t.projects or run.spec.priority not in t.priority_classes:
            return  # it waits, as in ``State.invalid`` (``explain_all`` says why)
        if run.not_before is not None and run.not_before > self._now:
            heapq.heappush(self._backoff, (run.not_before, run.seq, run.id))
        else:
            self._enqueue(run)

    def _enqueue(self, run: Run) -> None:
        self._engine.submit(self._spec(run))
        self._queued.add(run.id)

    def _topology_ix(self, key: str) -> int:
        """A topology key's number; a key no node has gets its own number, past every node's
        labels: runs asking for two such keys are in two queues, as the reference files them
        (one number for both once made one queue of them, judged by its head alone)."""
        ix = self._key_ix.get(key)
        if ix is None:
            ix = self._unknown_keys.setdefault(key, len(self._keys) + len(self._unknown_keys))
        return ix

    def _spec(self, run: Run) -> _engine.RunSpec:
        """The run as the extension's ``submit`` and ``add_active`` take it."""
        req, spec = run.request, run.spec
        pinned = None
        if spec.backend is not None:
            # a backend the cluster lacks gets a number no node has: nothing can host it
            pinned = self._backend_ix.get(spec.backend, len(self.backends))
        return _engine.RunSpec(
            id=run.id,
            seq=run.seq,
            project=self._project_ix.get(run.project, len(self.projects)),
            priority=self.template.priority_of(run),
            gpus=req.gpus,
            nodes=req.nodes,
            gpu_types=[i for i, t in enumerate(self.types) if req.accepts(t)],
            backend=pinned,
            topology_key=None if req.topology_key is None else self._topology_ix(req.topology_key),
            topology_required=req.topology_required,
            cpu_milli=req.cpu_milli,
            host_memory_mb=req.host_memory_mb,
            max_runtime_s=spec.max_runtime_s,
            preemptible=spec.preemptible,
            grace_s=float(spec.checkpoint.grace_s),
            submitted_at=run.submitted_at,
            last_checkpoint_at=run.last_checkpoint_at,
            attained_gpu_s=run.attained_gpu_s,
            accepts=list(req.gpu_types),
            shape=self._shape(run),
        )

    def _shape(self, run: Run) -> _engine.ShapeSpec | None:
        """A MIG, shared or CPU-only request as ``_engine.ShapeSpec`` (None: whole GPUs); a
        profile no node offers gets a number of its own that no node has (numbered as they
        come: two such profiles are two queues, as ``queue_keys.shape_key`` keys them by
        name)."""
        req = run.request
        if req.shape == "cpu":
            return _engine.ShapeSpec(cpu_only=True)
        if req.mig is not None:
            profile = self._profile_ix.get(req.mig)
            if profile is None:
                profile = self._profile_ix[req.mig] = len(self._profile_ix)
            return _engine.ShapeSpec(mig=profile, mig_share=mig_share(req.mig))
        if req.shape == "shared":
            return _engine.ShapeSpec(fraction=req.gpu_fraction, memory_mb=req.gpu_memory_mb)
        return None

    def remove_pending(self, run_id: str) -> Run:
        """A pending run leaves without running (``State.remove_pending``)."""
        run = self.pending.pop(run_id)
        if run_id in self._queued:
            self._queued.discard(run_id)
            self._engine.withdraw(run_id)
        return run  # (one in backoff is skipped when its time comes: it is no longer pending)

    def add_active(self, run: Run) -> None:
        """A run that holds its placement already, e.g. loaded from the store, booked as
        ``held.as_held`` leaves it (``State.add_active``)."""
        run = as_held(run, self._by_name)
        crossing = native_support.held(self, run, _engine)
        if crossing is None:
            self._outside.add(run.id)
        else:
            self._engine.add_active(*crossing)
        self.active[run.id] = run

    def finish(self, run_id: str) -> Run:
        run = self.active.pop(run_id)
        if run_id in self._outside:
            self._outside.discard(run_id)
        else:
            self._engine.finish(run_id)
        return run

    def checkpoint(self, run_id: str, at: float) -> None:
        """An active run reported a checkpoint at ``at`` (``State.checkpoint``)."""
        run = self.active.get(run_id)
        if run is None:
            return
        self.active[run_id] = replace(run, last_checkpoint_at=at)
        if run_id not in self._outside:
            self._engine.checkpoint(run_id, at)

    @property
    def used(self) -> dict[tuple[str, str], float]:
        """GPUs held per (project, GPU type), as ``Capacity.used``."""
        got = self._engine.used()
        n = len(self.types)
        return {
            (p, t): got[i * n + j]
            for i, p in enumerate(self.projects)
            for j, t in enumerate(self.types)
        }

    def snapshot(self, now: float) -> Snapshot:
        return replace(
            self.template,
            now=now,
            pending=tuple(self.pending.values()),
            active=tuple(self.active.values()),
            anchor=self.kept_anchor(),
        )

    def kept_anchor(self) -> str | None:
        """The run that keeps the reservation next cycle (``Snapshot.anchor``), or None."""
        return self._engine.anchor()

    # -- cycles -------------------------------------------------------------------------
    def cycle(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> Decision:
        """One cycle; its decision is applied (admitted runs become active, victims are
        flagged and hold nothing from then on; each victim's preemptor is among the
        admissions). ``spent``: GPU-hours and USD spent per budgeted project in its current
        window (default: the template's), as ``FromScratch.cycle`` takes it."""
        self._due(now)
        admitted, preempted = self._engine.cycle(
            now,
            native_support.history(self, usage_history),
            native_support.spent(self, spent, _engine),
        )
        admissions = []
        names, dev_names, backends, types = (
            self._node_names,
            self._dev_names,
            self.backends,
            self.types,
        )
        pending, active, queued = self.pending, self.active, self._queued
        slot, place, admission = _NODE_SLOT, _PLACEMENT, _ADMISSION
        for a in admitted:
            rid = a.run_id
            run = pending.pop(rid)
            queued.discard(rid)
            req = run.spec.request
            # (a memory cap is kept only on a shared device: ``req.shape == "shared"``, read
            # without the property's calls)
            memory = req.gpu_memory_mb if req.mig is None else None
            fraction, cpu, host_memory = a.fraction, req.cpu_milli, req.host_memory_mb
            placement = place(
                backends[a.backend],
                types[a.gpu_type],
                tuple(
                    [
                        slot(
                            names[n],
                            tuple(map(dev_names[n].__getitem__, devs)),
                            fraction,
                            memory,
                            cpu,
                            host_memory,
                        )
                        for n, devs in a.slots
                    ]
                ),
            )
            admissions.append(admission(rid, placement))
            active[rid] = running(run, placement, now)
        preemptions = []
        for pr in preempted:
            vid, for_id, lost = pr.run_id, pr.for_run_id, pr.lost_gpu_s
            v, run = self.active[vid], self.active[for_id]  # admitted in this decision
            if v.project == run.project:
                why = f"preempted for run {run.id} (priority {run.spec.priority})"
            elif pr.borrower_shares is not None:
                why = borrowers.taken_text(run, v.project, *pr.borrower_shares)
            else:
                why = (
                    f"reclaimed: project {run.project} needs its nominal quota back; project "
                    f"{v.project} was borrowing"
                )
            ck = v.spec.checkpoint
            preemptions.append(_PREEMPTION(vid, why, ck.signal, ck.grace_s, for_id, lost))
            self.active[vid] = going(v)
        return _DECISION(tuple(admissions), tuple(preemptions), (), ())  # type: ignore[no-any-return]

    @property
    def queued(self) -> set[str]:
        """The pending runs in the extension's queues (not invalid, not in backoff)."""
        return self._queued

    def _due(self, now: float) -> None:
        """Runs whose backoff is over by ``now`` join their queues."""
        self._now = now
        while self._backoff and self._backoff[0][0] <= now:
            _, _, rid = heapq.heappop(self._backoff)
            run = self.pending.get(rid)
            if run is not None and rid not in self._queued:
                self._enqueue(run)

    def explain_native(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> _engine.Explanation:
        """The extension's explanation of a cycle at ``now`` (nothing is applied): codes,
        parameters and ETAs (``native_explain`` renders them)."""
        self._due(now)
        return self._engine.explain(
            now,
            native_support.history(self, usage_history),
            native_support.spent(self, spent, _engine),
        )

    def explain_all(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> list[PendingReason]:
        """A reason and ETA for every pending run, as a cycle at ``now`` would leave it
        (nothing is applied; ``native_explain``)."""
        self._due(now)
        return native_explain.explain_all(self, now, usage_history, spent)
