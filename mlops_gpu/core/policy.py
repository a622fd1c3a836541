"""Policies behind one entry point, ``decide(snapshot)``.

The foundation policy (``default`` until the full scheduling core replaces it), one cycle:
1. snapshot -> free devices per node and GPUs used per project and type (``Capacity``);
2. order pending runs: priority class (high first), then submit time, then sequence number;
3. fit: for each acceptable GPU type, the project's usage must stay within nominal quota, or
   within nominal + borrowing limit while its cohort as a whole stays within the cohort's
   nominal total (idle quota of cohort members is lent);
4. place: first fit over schedulable nodes in name order, lowest device ids first; a gang takes
   ``nodes`` distinct nodes of one backend and one type, all or none;
5. explain: every run not admitted gets a reason code and a sentence.
No preemption and no ETA yet (the ETA stays null and the reason says what the run waits for).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.decision import Admission, Decision, PendingReason, ReasonCode
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import NodeSlot, Placement, Run


def _order_key(snap: Snapshot) -> Callable[[Run], tuple[int, float, int]]:
    return lambda r: (-snap.priority_of(r), r.submitted_at, r.seq)


def _cohort_members(snap: Snapshot) -> dict[str, list[str]]:
    members: dict[str, list[str]] = defaultdict(list)
    for p in snap.projects.values():
        if p.cohort is not None:
            members[p.cohort].append(p.name)
    return members


def _quota_problem(
    snap: Snapshot, cap: Capacity, members: dict[str, list[str]], run: Run, gpu_type: str
) -> str | None:
    """None if ``run`` fits the project's quota for ``gpu_type``, else why not."""
    proj = snap.projects[run.project]
    q = proj.quota(gpu_type)
    need = run.request.total_gpus
    used = cap.used[(proj.name, gpu_type)]
    if used + need <= q.nominal:
        return None
    limit = None if q.borrowing_limit is None else q.nominal + q.borrowing_limit
    if limit is not None and used + need > limit:
        return (
            f"project {proj.name} holds {used} of its {limit} {gpu_type} "
            f"(nominal {q.nominal} + borrowing limit {q.borrowing_limit}); it needs {need} more"
        )
    if proj.cohort is None:
        return (
            f"project {proj.name} holds {used} of its nominal {q.nominal} {gpu_type} and has "
            "no cohort to borrow from"
        )
    names = members[proj.cohort]
    cohort_nominal = sum(snap.projects[m].quota(gpu_type).nominal for m in names)
    cohort_used = sum(cap.used[(m, gpu_type)] for m in names)
    if cohort_used + need > cohort_nominal:
        idle = max(cohort_nominal - cohort_used, 0)
        return (
            f"project {proj.name} is at its nominal {q.nominal} {gpu_type} and cohort "
            f"{proj.cohort} has {idle} idle to lend; it needs {need}"
        )
    return None


def _place(snap: Snapshot, cap: Capacity, run: Run, gpu_type: str) -> Placement | None:
    req = run.request
    by_backend: dict[str, list[NodeSlot]] = defaultdict(list)
    for node in sorted(cap.nodes.values(), key=lambda n: n.name):
        if node.gpu_type != gpu_type or not node.schedulable:
            continue
        if run.spec.backend is not None and node.backend != run.spec.backend:
            continue
        free = cap.free[node.name]
        if len(free) < req.gpus:
            continue
        slots = by_backend[node.backend]
        slots.append(NodeSlot(node=node.name, devices=tuple(free[: req.gpus])))
        if len(slots) == req.nodes:
            return Placement(backend=node.backend, gpu_type=gpu_type, slots=tuple(slots))
    return None


def _could_ever_fit(snap: Snapshot, run: Run, gpu_type: str) -> bool:
    req = run.request
    per_backend: dict[str, int] = defaultdict(int)
    for n in snap.nodes:
        if (
            n.gpu_type == gpu_type
            and n.capacity >= req.gpus
            and (run.spec.backend is None or n.backend == run.spec.backend)
        ):
            per_backend[n.backend] += 1
    return any(c >= req.nodes for c in per_backend.values())


def _shape(run: Run, gpu_types: list[str]) -> str:
    req = run.request
    types = " or ".join(gpu_types) if gpu_types else "GPUs (no type in this cluster)"
    where = "on one node" if req.nodes == 1 else f"on each of {req.nodes} nodes"
    return f"needs {req.gpus} {types} {where}"


def decide_first_fit(snap: Snapshot) -> Decision:
    cap = Capacity(snap)
    members = _cohort_members(snap)
    all_types = sorted({n.gpu_type for n in snap.nodes})
    admissions: list[Admission] = []
    pending: list[PendingReason] = []
    blocked_projects: dict[str, str] = {}
    strict = snap.policy.queueing == "strict-fifo"

    for run in sorted(snap.pending, key=_order_key(snap)):
        if run.project not in snap.projects or run.spec.priority not in snap.priority_classes:
            what = "project" if run.project not in snap.projects else "priority class"
            pending.append(PendingReason(run.id, ReasonCode.INVALID, f"unknown {what}"))
            continue
        if strict and run.project in blocked_projects:
            head = blocked_projects[run.project]
            pending.append(
                PendingReason(
                    run.id,
                    ReasonCode.QUEUED_BEHIND,
                    f"queued behind run {head} (strict FIFO in project {run.project})",
                )
            )
            continue
        types = [t for t in all_types if run.request.accepts(t)]
        placement = None
        quota_msgs: list[str] = []
        for t in types:
            problem = _quota_problem(snap, cap, members, run, t)
            if problem is not None:
                quota_msgs.append(problem)
                continue
            placement = _place(snap, cap, run, t)
            if placement is not None:
                break
        if placement is not None:
            cap.take(run.project, placement)
            admissions.append(Admission(run.id, placement))
            continue
        blocked_projects.setdefault(run.project, run.id)
        pending.append(_explain(snap, cap, run, types, quota_msgs))
    return Decision(admissions=tuple(admissions), pending=tuple(pending))


def _explain(
    snap: Snapshot, cap: Capacity, run: Run, types: list[str], quota_msgs: list[str]
) -> PendingReason:
    shape = _shape(run, types)  # the acceptable types that exist here
    fits_ever = [t for t in types if _could_ever_fit(snap, run, t)]
    if not fits_ever:
        return PendingReason(
            run.id,
            ReasonCode.UNSCHEDULABLE,
            f"{shape}; no node of this cluster can host it",
        )
    if quota_msgs and len(quota_msgs) == len(types):
        return PendingReason(run.id, ReasonCode.QUOTA, f"{shape}; " + "; ".join(quota_msgs))
    blocks = ", ".join(f"{cap.largest_free_block(t)} {t}" for t in fits_ever)
    return PendingReason(
        run.id,
        ReasonCode.NO_CAPACITY,
        f"{shape}; the largest free block is {blocks}; no ETA: it waits for running runs to end",
    )


POLICIES: dict[str, Callable[[Snapshot], Decision]] = {"default": decide_first_fit}


def decide(snap: Snapshot) -> Decision:
    """The scheduling decision for ``snap`` under the policy it names."""
    return POLICIES[snap.policy.name](snap)
