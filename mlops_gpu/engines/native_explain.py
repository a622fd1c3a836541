"""The native engine's explanations: a reason and ETA for every pending run, from the codes,
parameters and ETAs the Rust engine works out (``_engine.Engine.explain``), rendered into
sentences by ``reason_text``, the table the Python core's cycle renders its own with.

What the engine never sees is explained here, as ``cycle_explain.explain`` does: runs with an
unknown project or class (``invalid``), runs waiting out their backoff, and the runs of projects
whose spent budget makes them wait. Everything else (codes, parameters, ETAs, the order runs are
booked in) comes from the engine.

Invariant: the same ``PendingReason`` for every run as a cycle of the Python core on the same
state (``tests/test_native_core.py`` compares them at every cycle of random workloads).
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import TYPE_CHECKING

from mlops_gpu.core import reason_text as rt
from mlops_gpu.core.decision import PendingReason, ReasonCode
from mlops_gpu.core.explain import shape_text
from mlops_gpu.core.fairshare import budget_exceeded
from mlops_gpu.core.quota import cohort_roots
from mlops_gpu.model import ResourceRequest, Run

if TYPE_CHECKING:
    import mlops_gpu._engine as _engine
    from mlops_gpu.engines.native import NativeEngine


def explain_all(
    eng: NativeEngine,
    now: float,
    usage_history: Mapping[tuple[str, str], float] | None,
    spent: Mapping[str, tuple[float, float]] | None,
) -> list[PendingReason]:
    """A reason and ETA for every pending run of ``eng`` as a cycle at ``now`` would leave it
    (nothing is applied).

    The garbage collector waits while it runs: it makes one object per pending run and none
    refers back, yet at 50,000 runs the collections those allocations set off (each older
    generation's walking every live run) were a sixth of its time. It runs again as it was
    after, also on an error."""
    if not gc.isenabled():
        return _explain_all(eng, now, usage_history, spent)
    gc.disable()
    try:
        return _explain_all(eng, now, usage_history, spent)
    finally:
        gc.enable()


def _explain_all(
    eng: NativeEngine,
    now: float,
    usage_history: Mapping[tuple[str, str], float] | None,
    spent: Mapping[str, tuple[float, float]] | None,
) -> list[PendingReason]:
    t = eng.template
    out: dict[str, PendingReason] = {}
    queued = eng.queued
    waiting: list[PendingReason] = []
    # (most pending runs are queued, a subset: the engine explains those; the rest in pending
    # order)
    rest = eng.pending.keys() - queued if len(eng.pending) > len(queued) else ()
    for run in [r for rid, r in eng.pending.items() if rid in rest] if rest else []:
        if run.project not in t.projects or run.spec.priority not in t.priority_classes:
            what = "project" if run.project not in t.projects else "priority class"
            out[run.id] = PendingReason(run.id, ReasonCode.INVALID, f"unknown {what}")
        else:
            nb = run.not_before
            waiting.append(
                PendingReason(
                    run.id,
                    ReasonCode.BACKOFF,
                    f"requeued as attempt {run.attempt}; backoff for {(nb or now) - now:.0f}s more",
                    nb,
                )
            )
    for p in sorted(waiting, key=lambda p: _backoff_key(eng.pending[p.run_id])):
        out[p.run_id] = p
    snap = replace(t, spent=t.spent if spent is None else spent)
    spent_wait: dict[str, str] = {}  # project -> why its runs wait
    for name, proj in t.projects.items():
        budget = proj.budget
        note = budget_exceeded(snap, name) if budget is not None else None
        if note is None or budget is None or budget.action != "wait":
            continue
        spent_wait[name] = f"{note}; it waits until the window frees budget"
    if spent_wait:  # (one pass over the pending runs, in their order)
        for run in eng.pending.values():
            why = spent_wait.get(run.project)
            if why is not None and run.id in queued:
                out[run.id] = PendingReason(run.id, ReasonCode.BUDGET, why)
    got = eng.explain_native(now, usage_history, spent)
    # (once per call, not per quota reason: at 50,000 pending runs that was a third of the
    # Python side)
    roots = cohort_roots(t)
    shapes: dict[tuple[ResourceRequest, tuple[int, ...]], str] = {}
    texts = [_text(eng, r, roots, shapes) for r in got.reasons]
    codes = [ReasonCode(r.code) for r in got.reasons]
    whys = [_no_eta(eng, w) for w in got.no_eta]
    said: dict[tuple[int, int], str] = {}
    reasons, no_eta = got.reason, got.why
    # (the engine explains only queued runs, none of those above; no call per run here: the
    # sentence with a no-ETA reason appended is made once per pair)
    sentences = [
        texts[ri]
        if wi is None
        else said.get((ri, wi)) or said.setdefault((ri, wi), f"{texts[ri]}; {whys[wi]}")
        for ri, wi in zip(reasons, no_eta, strict=True)
    ]
    # (the engine makes the objects: in Python that was the largest part of this call)
    explained: list[PendingReason] = got.pending_objects(PendingReason, codes, sentences)
    return [*out.values(), *explained]


_FIELDS = ("run_id", "reason_code", "reason", "eta")
assert tuple(f.name for f in fields(PendingReason)) == _FIELDS, "PendingReason changed"
assert PendingReason.__dataclass_params__.frozen and "__slots__" in PendingReason.__dict__  # type: ignore[attr-defined]


def _backoff_key(run: Run) -> tuple[float, int, str]:
    """Runs in backoff are explained in the order their backoff ends (``State.backoff``)."""
    return (run.not_before or 0.0, run.seq, run.id)


def _text(
    eng: NativeEngine,
    r: _engine.Reason,
    roots: Mapping[str, str | None],
    shapes: dict[tuple[ResourceRequest, tuple[int, ...]], str],
) -> str:
    """The sentence of one reason the engine returned (``roots``: ``cohort_roots`` of the
    engine's template; ``shapes``: the ``shape_text`` of each request and types met so far in
    the call, as thousands of reasons name a few hundred shapes)."""
    types, projects = eng.types, eng.projects
    if r.code == "queued_behind":
        return rt.queued_behind(r.anchor, projects[r.res_project])
    run = eng.pending[r.subject]
    key = (run.spec.request, tuple(r.types))
    shape = shapes.get(key)
    if shape is None:
        shape = shapes[key] = shape_text(run, [types[i] for i in key[1]])
    if r.code == "unschedulable":
        return rt.unschedulable(shape)
    if r.code == "reserved":
        return rt.reserved(
            shape, r.gpus_held, r.anchor, projects[r.res_project], types[r.res_type], r.at
        )
    if r.code == "quota":
        # (each type's amount as the engine judged it: a placement's share where it was
        # placed there, else the request's)
        proj = eng.template.projects[run.project]
        root = roots[run.project]
        return rt.over_quota(
            shape,
            (
                rt.quota_problem(
                    kind, run.project, types[ti], proj.quota(types[ti]), v, amount, root, v
                )
                for ti, kind, v, amount in r.quota
            ),
        )
    if r.code == "no_capacity":
        borrowed = [(types[ti], projects[p], b) for ti, p, b, *_ in r.borrowers]
        lent = [rt.runs_held(*b[3:]) for b in r.borrowers] if r.lent else None
        blocks = [(types[ti], n) for ti, n in r.blocks]
        return rt.no_capacity(shape, blocks, borrowed, lent)
    raise ValueError(f"the engine returned an unknown reason code {r.code!r}")


def _no_eta(eng: NativeEngine, w: _engine.NoEta) -> str:
    """Why runs have no ETA, in words."""
    kind, gpus, project, names, total = w
    if kind == "held_unknown":
        return rt.held_unknown(gpus)
    if kind == "quota_unknown":
        return rt.quota_unknown(None if project is None else eng.projects[project])
    if kind == "reserved":
        return rt.reserved_unknown(names, total)
    return rt.NO_ETA[kind]
