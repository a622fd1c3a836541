"""Eligibility: which pending runs the policy may consider this cycle (Slurm-like job control).

Before the policy (``decide``, and the engines through ``gated.Gated``) a pending run is judged,
first match wins:
1. a dependency that can never be met (``afterok`` on a run that failed or was cancelled,
   ``afternotok`` on one that succeeded, an id nobody knows): the run is *doomed*, reason
   ``dependency``; the controller cancels it with that reason;
2. ``held`` by a user, until released;
3. ``dependency``: a run it depends on has not ended (the reason names the blocking ids);
4. ``begin_time``: its ``--begin`` time is after ``now`` (the ETA is that time);
5. ``array_limit``: of its array's elements that passed 1-4, only the first ``limit - running``
   (by submit sequence) may be considered, where ``running`` counts the array's active
   elements, those being preempted included (they still run until they exit). Elements of an
   array have identical requests, so passing the first ones is exact: the policy would take
   them in that order anyway.
Only the runs that pass go to the policy, so the engines (Python and Rust) see the same queue
and make the same decisions; the others get their reason here.

Pure: ``now`` comes from the snapshot. A dependency is waited on while its run is pending or
active, judged by ``Snapshot.ended`` once it ended, and unknown (doomed) otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from mlops_gpu.core.decision import PendingReason, ReasonCode
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Phase, Run
from mlops_gpu.model.jobs import Dependency

#: What a dependency needs of its run's final phase.
_MEETS: dict[str, frozenset[Phase]] = {
    "afterany": frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}),
    "afterok": frozenset({Phase.SUCCEEDED}),
    "afternotok": frozenset({Phase.FAILED, Phase.CANCELLED}),
}
_SHOWN = 5  # blocking ids named in a sentence


def controlled(run: Run) -> bool:
    """Whether any job control applies to ``run`` (else it always passes)."""
    s = run.spec
    return bool(run.held or s.dependencies or s.begin_at is not None or s.array_limit is not None)


def never_met(dep: Dependency, phase: Phase | None) -> str:
    """Why ``dep`` can never be met, its run having ended in ``phase`` (None: unknown id)."""
    if phase is None:
        return f"run {dep.run_id} does not exist"
    return f"run {dep.run_id} {phase.value} ({dep.kind} needs it to " + (
        "succeed)" if dep.kind == "afterok" else "fail or be cancelled)"
    )


def _ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:_SHOWN])
    return shown if len(ids) <= _SHOWN else f"{shown} and {len(ids) - _SHOWN} more"


def doomed_reason(run: Run, why: str) -> PendingReason:
    return PendingReason(
        run.id, ReasonCode.DEPENDENCY, f"dependency can never be met: {why}; cancelled"
    )


def dependency_reason(run: Run, blocking: list[Dependency]) -> PendingReason:
    kinds = sorted({d.kind for d in blocking})
    ids = [d.run_id for d in blocking]
    return PendingReason(
        run.id,
        ReasonCode.DEPENDENCY,
        f"waits for {'run' if len(ids) == 1 else f'{len(ids)} runs'} {_ids(ids)} to end "
        f"({', '.join(kinds)})",
    )


def held_reason(run: Run) -> PendingReason:
    return PendingReason(
        run.id, ReasonCode.HELD, f"held; `mlops-gpu release {run.id}` lets it queue"
    )


def begin_reason(run: Run) -> PendingReason:
    at = run.spec.begin_at
    assert at is not None
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return PendingReason(run.id, ReasonCode.BEGIN_TIME, f"begins at {when} (--begin)", at)


def array_reason(run: Run, running: int) -> PendingReason:
    s = run.spec
    return PendingReason(
        run.id,
        ReasonCode.ARRAY_LIMIT,
        f"array {s.array_id} has {running} elements running or queued, as many as its "
        f"%{s.array_limit} allows",
    )


def judge_deps(
    run: Run, live: Collection[str], ended: Mapping[str, Phase | None]
) -> tuple[str | None, list[Dependency]]:
    """(why the dependencies can never be met, or None; the dependencies still to end)."""
    blocking: list[Dependency] = []
    for dep in run.spec.dependencies:
        if dep.run_id in ended:
            phase = ended[dep.run_id]
            if phase is None or phase not in _MEETS[dep.kind]:
                return never_met(dep, phase), []
        elif dep.run_id in live:
            blocking.append(dep)
        else:
            return never_met(dep, None), []
    return None, blocking


def before_array(
    run: Run, now: float, live: Collection[str], ended: Mapping[str, Phase | None]
) -> tuple[PendingReason | None, bool]:
    """Steps 1-4 for one run: (its reason, or None when it passes them; whether it is doomed)."""
    why, blocking = judge_deps(run, live, ended)
    if why is not None:
        return doomed_reason(run, why), True
    if run.held:
        return held_reason(run), False
    if blocking:
        return dependency_reason(run, blocking), False
    if run.spec.begin_at is not None and run.spec.begin_at > now:
        return begin_reason(run), False
    return None, False


@dataclass(frozen=True, slots=True)
class Gate:
    #: The pending runs the policy may consider, in the snapshot's order.
    eligible: tuple[Run, ...]
    #: Why each other pending run waits (doomed ones included).
    waiting: Mapping[str, PendingReason]
    #: The pending runs whose dependencies can never be met.
    doomed: tuple[PendingReason, ...]


def running_elements(active: Iterable[Run]) -> dict[str, int]:
    """Active elements per array id (those being preempted included)."""
    out: dict[str, int] = defaultdict(int)
    for a in active:
        if a.spec.array_id is not None:
            out[a.spec.array_id] += 1
    return out


def gate(snap: Snapshot) -> Gate:
    """Judge every pending run of ``snap`` (steps 1-5 of the module docstring)."""
    if not any(controlled(r) for r in snap.pending):
        return Gate(snap.pending, {}, ())
    live = {r.id for r in snap.pending}
    live.update(a.id for a in snap.active)
    waiting: dict[str, PendingReason] = {}
    doomed: list[PendingReason] = []
    ready: dict[str, list[Run]] = defaultdict(list)
    for run in snap.pending:
        if not controlled(run):
            continue
        reason, never = before_array(run, snap.now, live, snap.ended)
        if reason is not None:
            waiting[run.id] = reason
            if never:
                doomed.append(reason)
        elif run.spec.array_limit is not None and run.spec.array_id is not None:
            ready[run.spec.array_id].append(run)
    if ready:
        running = running_elements(snap.active)
        for aid, elements in ready.items():
            elements.sort(key=lambda r: r.seq)
            limit = elements[0].spec.array_limit or 0
            room = max(limit - running.get(aid, 0), 0)
            for run in elements[room:]:
                waiting[run.id] = array_reason(run, limit)
    eligible = tuple(r for r in snap.pending if r.id not in waiting)
    seq = {r.id: r.seq for r in snap.pending}
    doomed.sort(key=lambda p: seq[p.run_id])  # as ``gated.Gated`` reports them
    return Gate(eligible, waiting, tuple(doomed))
