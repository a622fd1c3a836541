"""The native engine: ``engine.Incremental``'s decisions, made by a Rust extension.

``NativeEngine`` has ``Incremental``'s interface (``submit``, ``finish``, ``checkpoint``,
``cycle``, ``explain_all``, ``pending``, ``active``) and makes the same admissions, placements
and preemptions (each with its preemptor admitted in the same decision and the victim's lost
GPU-seconds), in the same order; ``tests/test_native_core.py`` compares them cycle by cycle on
random workloads, and ``benchmarks/core_throughput.py --core native`` on the full benchmark.

It serves what the extension implements, and says what it does not (``unsupported``,
``run_unsupported``; ``NotSupported`` is raised, nothing is guessed):
- whole GPUs, without topology or host CPU and memory, on nodes without MIG slices, shared
  devices or tracked host resources;
- no project budgets (every ``order``: ``shortest``, ``submit``, ``las``).
Runs with an unknown project or class wait (as ``invalid``) and runs in backoff wait here until
their ``not_before``, as in ``State``. A cycle's decision carries no pending reasons: a cycle
of the Python core explains the same state on demand (``explain_all``).

The extension is ``native/`` (Rust), built by ``scripts/native_core.py`` (cached by source
hash) or into an installed package (``MLOPS_GPU_BUILD_NATIVE=1 pip install .``);
``load(path)`` imports it from a built file, ``installed()`` finds it (``$MLOPS_GPU_NATIVE``, a
path; or the package's own copy). Finding and loading the extension is the only file access
here; the engine itself is as pure as the Python one.

Invariant: the indices given to the extension number GPU types, backends, nodes and projects
in the sorted order of their names (the Python core breaks its ties by name), so that index
order is name order there.
"""

from __future__ import annotations

import heapq
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlops_gpu.core.decision import Admission, Decision, PendingReason, Preemption
from mlops_gpu.core.policy import Cycle
from mlops_gpu.core.quota import cohort_roots
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.core.state import State
from mlops_gpu.model import NodeSlot, Phase, Placement, Run

MODULE = "mlops_gpu_native"
#: The built extension's path (``scripts/native_core.py build`` prints it); ``off``: none.
ENV = "MLOPS_GPU_NATIVE"


class NotSupported(ValueError):
    """The native engine does not implement what the snapshot or run asks for."""


_LOADED: dict[str, Any] = {}


def load(path: str) -> Any:
    """The extension module built at ``path`` (``scripts/native_core.py build`` prints it);
    loaded once per path."""
    if path in _LOADED:
        return _LOADED[path]
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _LOADED[path] = module
    return module


def installed() -> Any | None:
    """The extension named by ``$MLOPS_GPU_NATIVE`` (an error if it does not load), else the
    one built into this package, else None (``off`` in the variable: None)."""
    path = os.environ.get(ENV, "")
    if path == "off":
        return None
    if path:
        return load(path)
    found = sorted(Path(__file__).parent.glob(f"{MODULE}*.so"))
    return load(str(found[0])) if found else None


def unsupported(template: Snapshot) -> str | None:
    """Why the native engine cannot schedule for ``template``, or None when it can."""
    p = template.policy
    if p.order not in ("shortest", "submit", "las"):
        return f"policy.order {p.order!r} (the native engine orders by shortest, submit or las)"
    for name, proj in template.projects.items():
        if proj.budget is not None:
            return f"project {name} has a budget (the native engine has no budgets)"
    for n in template.nodes:
        if n.mig or n.shared or n.cpu_milli is not None or n.host_memory_mb is not None:
            return (
                f"node {n.name} has MIG slices, shared devices or tracked host resources "
                "(the native engine places whole GPUs only)"
            )
    return None


def run_unsupported(run: Run) -> str | None:
    """Why the native engine cannot queue ``run``, or None when it can."""
    r = run.request
    if r.shape != "whole":
        return f"run {run.id} asks for a {r.shape} GPU share (the native engine: whole GPUs)"
    if r.topology_key is not None:
        return f"run {run.id} asks for topology {r.topology_key!r}"
    if r.cpu_milli or r.host_memory_mb:
        return f"run {run.id} asks for host CPU or memory"
    return None


class NativeEngine:
    """``engine.Incremental`` with the cycle in Rust (see the module docstring)."""

    def __init__(self, template: Snapshot, module: Any) -> None:
        why = unsupported(template)
        if why is not None:
            raise NotSupported(why)
        self.template = template
        self.pending: dict[str, Run] = {}
        self.active: dict[str, Run] = {}
        self._backoff: list[tuple[float, int, str]] = []
        self._queued: set[str] = set()  # the pending runs in the extension's queues
        self._now = template.now
        self.types = sorted({n.gpu_type for n in template.nodes})
        self._type_ix = {t: i for i, t in enumerate(self.types)}
        self.backends = sorted({n.backend for n in template.nodes})
        self._backend_ix = backend_ix = {b: i for i, b in enumerate(self.backends)}
        nodes = sorted(template.nodes, key=lambda n: n.name)
        self._node_ix = {n.name: i for i, n in enumerate(nodes)}
        self._nodes = nodes
        self.projects = sorted(template.projects)
        self._project_ix = {p: i for i, p in enumerate(self.projects)}
        roots = cohort_roots(template)
        root_names = sorted({r for r in roots.values() if r is not None})
        root_ix = {r: i for i, r in enumerate(root_names)}
        members: list[list[int]] = [[] for _ in root_names]
        for name in template.projects:  # the snapshot's project order
            root = roots[name]
            if root is not None:
                members[root_ix[root]].append(self._project_ix[name])
        projects = []
        for name in self.projects:
            proj = template.projects[name]
            terms = []
            for t in self.types:
                q = proj.quota(t)
                terms.append(
                    (
                        float(q.nominal),
                        None if q.borrowing_limit is None else float(q.borrowing_limit),
                        None if q.lending_limit is None else float(q.lending_limit),
                    )
                )
            root = roots[name]
            projects.append((proj.weight, None if root is None else root_ix[root], terms))
        capacity = [0.0] * len(self.types)
        of_type: list[list[int]] = [[] for _ in self.types]
        for n in template.nodes:  # the snapshot's node order (``eligible_nodes``)
            capacity[self._type_ix[n.gpu_type]] += n.capacity
            of_type[self._type_ix[n.gpu_type]].append(self._node_ix[n.name])
        specs = [
            (self._type_ix[n.gpu_type], backend_ix[n.backend], n.capacity, n.schedulable)
            for n in nodes
        ]
        p = template.policy
        self._engine = module.Engine(
            len(self.types),
            specs,
            [template.caps(b).multi_node for b in self.backends],
            projects,
            members,
            capacity,
            of_type,
            (
                p.order,
                [float(x) for x in p.las_thresholds_gpu_s],
                p.queueing == "strict-fifo",
                p.fair_share,
                float(p.half_life_s),
                p.preemption,
                p.backfill,
                float(p.shortest_preempt_ratio),
                float(p.min_runtime_before_preemption_s),
                p.preempt_uncheckpointed,
            ),
        )

    # -- events -------------------------------------------------------------------------
    def submit(self, run: Run) -> None:
        why = run_unsupported(run)
        if why is not None:
            raise NotSupported(why)
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

    def _spec(self, run: Run) -> tuple[tuple[object, ...], tuple[object, ...]]:
        """The run as the extension's ``submit`` and ``add_active`` take it."""
        req, spec = run.request, run.spec
        types = [i for i, t in enumerate(self.types) if req.accepts(t)]
        pinned = None
        if spec.backend is not None:
            # a backend the cluster lacks gets a number no node has: nothing can host it
            pinned = self._backend_ix.get(spec.backend, len(self.backends))
        return (
            (
                run.id,
                run.seq,
                self._project_ix[run.project],
                self.template.priority_of(run),
                req.gpus,
                req.nodes,
                types,
                pinned,
                spec.max_runtime_s,
            ),
            (
                spec.preemptible,
                float(spec.checkpoint.grace_s),
                run.submitted_at,
                run.last_checkpoint_at,
                run.attained_gpu_s,
            ),
        )

    def remove_pending(self, run_id: str) -> Run:
        """A pending run leaves without running (``State.remove_pending``)."""
        run = self.pending.pop(run_id)
        if run_id in self._queued:
            self._queued.discard(run_id)
            self._engine.withdraw(run_id)
        return run  # (one in backoff is skipped when its time comes: it is no longer pending)

    def add_active(self, run: Run) -> None:
        """A run that holds its placement already, e.g. loaded from the store
        (``State.add_active``)."""
        why = run_unsupported(run) or self._placement_unsupported(run)
        if why is not None:
            raise NotSupported(why)
        assert run.placement is not None
        p = run.placement
        # slots on nodes the cluster no longer has count in the GPUs held, as in ``Capacity``
        slots = [
            (n, [self._nodes[n].devices.index(d) for d in s.devices])
            for s in p.slots
            if (n := self._node_ix.get(s.node)) is not None
        ]
        self._engine.add_active(
            self._spec(run),
            self._backend_ix[p.backend],
            self._type_ix[p.gpu_type],
            slots,
            p.total_gpus,
            run.admitted_at,
            run.started_at,
            run.preempt_requested,
        )
        self.active[run.id] = run

    def _placement_unsupported(self, run: Run) -> str | None:
        p = run.placement
        if p is None:
            return f"run {run.id} is active without a placement"
        if p.backend not in self._backend_ix or p.gpu_type not in self._type_ix:
            return f"run {run.id} is placed on backend {p.backend}, type {p.gpu_type}: not here"
        if run.project not in self._project_ix:
            return f"run {run.id} holds GPUs for unknown project {run.project}"
        for s in p.slots:
            whole = s.fraction == 1.0 and s.memory_mb is None
            if not whole or len(set(s.devices)) != len(s.devices):
                return f"run {run.id} holds part of a GPU (the native engine: whole GPUs)"
            node = self._node_ix.get(s.node)
            if node is not None and not set(s.devices) <= set(self._nodes[node].devices):
                return f"run {run.id} holds devices that node {s.node} does not have"
        return None

    def finish(self, run_id: str) -> Run:
        run = self.active.pop(run_id)
        self._engine.finish(run_id)
        return run

    def checkpoint(self, run_id: str, at: float) -> None:
        """An active run reported a checkpoint at ``at`` (``State.checkpoint``)."""
        run = self.active.get(run_id)
        if run is None:
            return
        self.active[run_id] = replace(run, last_checkpoint_at=at)
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
        return self._engine.anchor()  # type: ignore[no-any-return]

    # -- cycles -------------------------------------------------------------------------
    def _history(self, usage_history: Mapping[tuple[str, str], float] | None) -> list[float] | None:
        hist = self.template.usage_history if usage_history is None else usage_history
        if not hist:
            return None
        out = [0.0] * (len(self.projects) * len(self.types))
        for (project, t), gpu_s in hist.items():
            p, ti = self._project_ix.get(project), self._type_ix.get(t)
            if p is not None and ti is not None:
                out[p * len(self.types) + ti] += gpu_s
        return out

    def cycle(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> Decision:
        """One cycle; its decision is applied (admitted runs become active, victims are
        flagged and hold nothing from then on; each victim's preemptor is among the
        admissions). ``spent`` is accepted for ``Incremental``'s signature: without budgets
        (``unsupported``) nothing reads it."""
        self._now = now
        while self._backoff and self._backoff[0][0] <= now:
            _, _, rid = heapq.heappop(self._backoff)
            run = self.pending.get(rid)
            if run is not None and rid not in self._queued:
                self._enqueue(run)
        admitted, preempted = self._engine.cycle(now, self._history(usage_history))
        admissions = []
        for rid, backend, t, slots in admitted:
            run = self.pending.pop(rid)
            self._queued.discard(rid)
            req = run.request
            placement = Placement(
                self.backends[backend],
                self.types[t],
                tuple(
                    NodeSlot(
                        self._nodes[n].name,
                        tuple(self._nodes[n].devices[d] for d in devs),
                        1.0,
                        None,
                        req.cpu_milli,
                        req.host_memory_mb,
                    )
                    for n, devs in slots
                ),
            )
            admissions.append(Admission(rid, placement))
            self.active[rid] = replace(
                run, phase=Phase.RUNNING, placement=placement, admitted_at=now, started_at=now
            )
        preemptions = []
        for vid, for_id, lost in preempted:
            v, run = self.active[vid], self.active[for_id]  # admitted in this decision
            why = (
                f"preempted for run {run.id} (priority {run.spec.priority})"
                if v.project == run.project
                else f"reclaimed: project {run.project} needs its nominal quota back; project "
                f"{v.project} was borrowing"
            )
            ck = v.spec.checkpoint
            preemptions.append(Preemption(vid, why, ck.signal, ck.grace_s, for_id, lost))
            self.active[vid] = replace(v, preempt_requested=True)
        return Decision(tuple(admissions), tuple(preemptions), ())

    def explain_all(
        self,
        now: float,
        usage_history: Mapping[tuple[str, str], float] | None = None,
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> list[PendingReason]:
        """A reason and ETA for every pending run, from a cycle of the Python core on the same
        state (nothing is applied)."""
        state = State.from_snapshot(self.snapshot(now))
        cycle = Cycle(state, now, usage_history, spent)
        cycle.run()
        return cycle.explain()
