"""What the native engine (``engines.native``) serves, and how an active run crosses into it.

``unsupported`` (a snapshot) gives the one-line reason the native engine cannot take a config,
or None: only a ``policy.borrower_share_ratio`` below 1, which the config refuses too;
``NativeEngine`` raises ``NotSupported`` with it (and where the extension is not installed;
the simulators, whose configs never name it, fall back to Python for that alone). ``held``
gives an active run, booked as ``core.held.as_held`` leaves it, as the extension's
``add_active`` takes it: every active run is taken (one on a node, GPU type, backend or
project the cluster no longer has too, as ``core.held`` says, checked by
``tests/test_native_held.py``). The native engine queues every pending run it is given; it serves:
- whole GPUs; with a topology (``topology_key``, required or preferred: nodes' labels cross
  as numbers, each key's values in name order); with host CPU and memory (runs' requests per
  node, nodes' capacities), under either ``policy.placement``: ``fragmentation`` (the default)
  places one-node runs by the growth of expected fragmentation and orders a run's GPU types by
  headroom and growth (``core/fragmentation.py``, ``type_choice``), as the Python core does to
  the last bit of its ``round()`` and ``sum()`` (runs' ``gpu_types`` cross as named:
  ``accepts``; compared on random clusters by ``tests/test_native_fragmentation.py``), with
  a ``Snapshot.shape_prior`` (the packing simulator's; as ``_engine.PriorShape``): any
  finite counts not below 0 (others are refused by both engines, ``ValueError``), whole or
  not, each shape's GPU types in any order: both engines key a prior shape by its types
  sorted (two shapes equal but for that order are one, their counts summed in the prior's
  order) and sum counts in the ranked order (``fragmentation.Mix``);
- MIG slices (``request.mig``; nodes' slices cross as ``_engine.PartSpec``, numbered after
  their whole devices, profiles numbered in name order) and parts of shared devices by
  fraction and/or memory (``gpu_fraction``, ``gpu_memory_mb``; as ``_engine.ShapeSpec``) under
  either placement (``fragmentation`` weighs a part by the growth of its node's expected
  fragmentation, ``after_share``; a shared node makes the cluster one to weigh, as host
  resources do: ``PartSpec.shared_node``); where fragmentation-aware placement weighs the
  cluster, MIG slices are placed best fit as elsewhere, book their host CPU and memory on
  the node (which its signature shows) and add no shape to the mix (``Capacity._host``), and
  a MIG run's GPU types are not reordered (``cycle._try``), as in the Python core (compared
  by ``tests/test_native_fragmentation.py``, whose clusters have MIG nodes and runs);
  active runs holding slices or parts cross with each slot's share
  (``_engine.SlotShare``), and what they are charged where a slot's node is gone
  (``_engine.Held.charged``);
- CPU-only runs (``gpus`` 0: host CPU and/or memory on one node of a type they accept, as
  ``_engine.ShapeSpec(cpu_only=True)``), placed by ``placement._place_cpu``'s rules (under
  ``fragmentation``: growth class and CPU balance first; then the most CPU per free GPU
  share left, then the name), charged no quota (amount 0, on the type placed; still held
  back where its project already holds more than ``QuotaBook.admits`` allows on every type),
  preempting and preempted as any run (they free host resources, they lose no GPU-seconds),
  never reserved for (backfill reserves for whole-GPU runs only); compared on random
  clusters by ``tests/test_native_core.py`` and ``tests/test_native_cpu.py``;
- every ``order`` (``shortest``, ``submit``, ``las``), with ``policy.shortest_preempt_borrowers``
  (``core/borrowers.py``; in Rust ``native/src/preempt/borrowers.rs``: each victim it takes
  crosses back with the two projects' shares for its message,
  ``_engine.Preempted.borrower_shares``), and project budgets: each cycle the projects whose
  budget is spent (``fairshare.budget_spent`` on the ``spent`` it is given) cross as
  ``_engine.BudgetSpent``: their runs wait (``action: wait``) or are served at the
  ``lower_to`` class (``action: lower``), as ``CycleBooks.level_of`` has it.

Invariant: everything not refused here is decided by the Rust engine exactly
as by the Python core (``tests/test_native_core.py``, ``tests/test_native_fragmentation.py``
and ``tests/test_native_held.py`` compare them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING

from mlops_gpu.core.fairshare import budget_spent
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Run

if TYPE_CHECKING:
    from mlops_gpu import _engine
    from mlops_gpu.engines.native import NativeEngine


class NotSupported(ValueError):
    """The native engine cannot run: the extension is not installed, or a snapshot asks for
    what the config refuses (``unsupported``)."""


def unsupported(template: Snapshot) -> str | None:
    """Why the native engine cannot schedule for ``template``, or None when it can."""
    p = template.policy
    if not p.borrower_share_ratio >= 1:  # (the config refuses it; a Snapshot built in code may not)
        return f"policy.borrower_share_ratio {p.borrower_share_ratio!r} (the native engine: >= 1)"
    return None


def held(eng: NativeEngine, run: Run, e: ModuleType) -> tuple[_engine.RunSpec, _engine.Held] | None:
    """The active ``run``, as ``held.as_held`` leaves it, as the extension (``e``)'s
    ``add_active`` takes it; None where the cluster has no GPU type at all to book it on (then
    it holds nothing any decision reads, in either engine)."""
    p = run.placement
    assert p is not None  # (``as_held`` refuses a run without one)
    if not eng.types:
        return None
    ty = eng._type_ix.get(p.gpu_type)
    on = [(n, s) for s in p.slots if (n := eng._node_ix.get(s.node)) is not None]
    slots = [(n, [eng._dev_names[n].index(d) for d in s.devices]) for n, s in on]
    shares = None
    if not all(s.fraction == 1.0 and s.memory_mb is None for _, s in on):
        shares = [e.SlotShare(fraction=s.fraction, memory_mb=s.memory_mb) for _, s in on]
    charged = None
    if ty is None:  # a type no run can ask for: its quota there is nobody's to read
        charged = 0.0
    elif len(on) != len(p.slots):  # slots on nodes the cluster lacks count in its quota
        charged = p.gpu_amount
    req, spec = run.request, run.spec
    if on:  # (its slots' host resources: ``as_held`` made them agree)
        s = on[0][1]
        req = replace(req, cpu_milli=s.cpu_milli, host_memory_mb=s.host_memory_mb)
    # (no victim on a type the cluster lacks: victims are sought by the types a run can use)
    spec = replace(spec, request=req, preemptible=spec.preemptible and ty is not None)
    return eng._spec(replace(run, spec=spec)), e.Held(
        # (the extension reads no held run's backend: nodes carry theirs)
        backend=eng._backend_ix.get(p.backend, 0),
        gpu_type=0 if ty is None else ty,
        slots=slots,
        gpus=p.total_gpus,
        admitted_at=run.admitted_at,
        started_at=run.started_at,
        going=run.preempt_requested,
        shares=shares,
        charged=charged,
    )


def history(
    eng: NativeEngine, usage_history: Mapping[tuple[str, str], float] | None
) -> list[float] | None:
    """The usage history a cycle is given (default: the template's), per (project, GPU type)
    in the extension's numbering, or None where there is none."""
    hist = eng.template.usage_history if usage_history is None else usage_history
    if not hist:
        return None
    out = [0.0] * ((len(eng.projects) + 1) * len(eng.types))  # (+1: ``held``'s)
    for (project, t), gpu_s in hist.items():
        p, ti = eng._project_ix.get(project), eng._type_ix.get(t)
        if p is not None and ti is not None:
            out[p * len(eng.types) + ti] += gpu_s
    return out


def spent(
    eng: NativeEngine, spent: Mapping[str, tuple[float, float]] | None, e: ModuleType
) -> list[_engine.BudgetSpent] | None:
    """The projects whose budget is spent, and what that does (``CycleBooks.level_of``): their
    runs wait, or are served at the ``lower_to`` class (one the cluster does not define
    changes nothing, as in ``core.cycle``)."""
    t = eng.template
    if not eng._budgeted:
        return None
    spent_now = t.spent if spent is None else spent
    out = []
    for name in eng._budgeted:
        budget = t.projects[name].budget
        assert budget is not None
        if not budget_spent(budget, *spent_now.get(name, (0.0, 0.0))):
            continue
        if budget.action == "wait":
            lower_to = None
        else:
            lower_to = t.priority_classes.get(budget.lower_to or "")
            if lower_to is None:
                continue
        out.append(e.BudgetSpent(project=eng._project_ix[name], lower_to=lower_to))
    return out
