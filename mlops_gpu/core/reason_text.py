"""The sentences of pending reasons, one table for both engines: each function renders one
reason code (or one part of one) from its parameters. The Python core's cycle
(``cycle.schedule``, ``quota.QuotaBook.problem``, ``backfill.EtaBook``) and the Rust engine's
explanation (``native.NativeEngine.explain_all``, from the codes and parameters the engine
returns) both call them, so a reason reads the same whichever engine decided.

Invariant: pure formatting; every number is formatted here and only here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from mlops_gpu.model import Quota

#: At most this many runs are named per borrower and kind; the rest are counted.
SHOWN = 5
#: At most this many runs are named in why a reservation's time is unknown.
SHOWN_UNKNOWN = 10


def quota_problem(
    kind: str,
    project: str,
    gpu_type: str,
    q: Quota,
    used: float,
    amount: float,
    root: str | None = None,
    idle: float = 0.0,
) -> str:
    """Why ``project`` (holding ``used``) may not add ``amount`` of ``gpu_type``
    (``QuotaBook.problem``): ``kind`` ``limit`` (nominal plus borrowing limit reached),
    ``alone`` (no cohort), ``nominal`` (the run is not preemptible: nominal only) or ``cohort``
    (its cohort tree ``root`` has only ``idle`` to lend)."""
    if kind == "limit":
        limit = q.nominal + (q.borrowing_limit or 0)
        return (
            f"project {project} holds {used:g} of its {limit:g} {gpu_type} (nominal "
            f"{q.nominal} + borrowing limit {q.borrowing_limit}); it needs {amount:g} more"
        )
    if kind == "alone":
        return (
            f"project {project} holds {used:g} of its nominal {q.nominal} {gpu_type} and "
            "has no cohort to borrow from"
        )
    if kind == "nominal":
        return (
            f"run is not preemptible: it may use only project {project}'s nominal quota "
            f"of {gpu_type} ({q.nominal:g}; {used:g} in use); submit it preemptible to borrow"
        )
    if kind == "cohort":
        return (
            f"project {project} is at its nominal {q.nominal} {gpu_type} and cohort "
            f"{root} has {idle:g} idle to lend; it needs {amount:g}"
        )
    raise ValueError(f"quota problem: expected limit, alone, nominal or cohort, got {kind!r}")


def over_quota(shape: str, problems: Iterable[str]) -> str:
    """``quota``: over quota on every acceptable type."""
    return f"{shape}; " + "; ".join(problems)


def unschedulable(shape: str) -> str:
    return f"{shape}; no node of this cluster can host it"


def no_capacity(
    shape: str,
    blocks: Iterable[tuple[str, int]],
    borrowed: list[tuple[str, str, float]],
    lent: list[str] | None,
) -> str:
    """``no_capacity``: the largest free block per type, and the GPUs borrowed by other members
    of the project's cohort tree ((type, project, GPUs)); ``lent``: when the run's project lends
    them, the runs through which each borrows (``runs_held``, one per borrower)."""
    text = f"{shape}; the largest free block is " + ", ".join(f"{n} {t}" for t, n in blocks)
    if lent is not None:
        return (
            text
            + "; lent: "
            + ", ".join(
                f"{b:g} {t} borrowed by project {p}{runs}"
                for (t, p, b), runs in zip(borrowed, lent, strict=True)
            )
        )
    if borrowed:
        return text + "; " + ", ".join(f"{b:g} {t} borrowed by project {p}" for t, p, b in borrowed)
    return text


def _names(runs: list[tuple[str, float | None]], total: int) -> str:
    shown = ", ".join(
        f"{rid} ({'no max_runtime' if end is None else f'ends by {end:.0f}'})"
        for rid, end in runs[:SHOWN]
    )
    return shown if total <= SHOWN else f"{shown} and {total - SHOWN} more"


def runs_held(
    reclaimable: list[tuple[str, float | None]],
    n_reclaimable: int,
    fixed: list[tuple[str, float | None]],
    n_fixed: int,
) -> str:
    """`` (reclaimable: ...; not preemptible, which cannot be reclaimed: ...)`` for a
    borrower's runs ((id, expected end or None), sorted by id; the first ``SHOWN`` of each
    kind and how many there are); "" when it holds none."""
    parts = []
    if n_reclaimable:
        parts.append(f"reclaimable: {_names(reclaimable, n_reclaimable)}")
    if n_fixed:
        parts.append(f"not preemptible, which cannot be reclaimed: {_names(fixed, n_fixed)}")
    return f" ({'; '.join(parts)})" if parts else ""


def reserved(
    shape: str, gpus_held: bool, anchor: str, project: str, gpu_type: str, at: float
) -> str:
    """``reserved``: it fits but for the anchor's reservation (of free GPUs, else of its
    project's quota of a type), due at ``at`` (``math.inf``: unknown)."""
    what = "free GPUs are held" if gpus_held else f"project {project}'s quota of {gpu_type} is held"
    when = (
        f"reserved to start by {at:.0f} (epoch s), and this run would not "
        "end before then (set max_runtime to backfill)"
        if math.isfinite(at)
        else "which waits for runs without max_runtime (its start time is unknown), "
        "and this run would take what it waits for"
    )
    return f"{shape}; {what} for run {anchor}, {when}"


def queued_behind(head: str, project: str) -> str:
    return f"queued behind run {head} (strict FIFO in project {project})"


#: Why a run has no ETA, by kind (the kinds that take no parameter).
NO_ETA = {
    "not_enough": "no ETA: not enough GPUs of this type will free up",
    "cohort_lends": "no ETA: it waits for quota its cohort lends",
    "plain": "no ETA",
}


def held_unknown(gpus: float) -> str:
    return f"no ETA: {gpus:g} GPUs are held by runs without max_runtime"


def quota_unknown(project: str | None) -> str:
    """No ETA: the runs holding the quota (``project``'s, or None: the cohort's) have no end."""
    whose = "the cohort's" if project is None else f"project {project}'s"
    return f"no ETA: {whose} running runs that hold its quota have no max_runtime"


def reserved_unknown(names: list[str], total: int) -> str:
    """The anchor's reservation time is unknown: the runs it waits for (sorted, the first
    ``SHOWN_UNKNOWN``, of ``total``)."""
    shown = ", ".join(names[:SHOWN_UNKNOWN]) + (
        f" and {total - SHOWN_UNKNOWN} more" if total > SHOWN_UNKNOWN else ""
    )
    return (
        "reserved (EASY backfill) at an unknown time: it waits for runs "
        f"{shown}, which have no max_runtime"
    )
