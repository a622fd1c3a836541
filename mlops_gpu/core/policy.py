"""The default policy, one scheduling cycle as numbered steps (``decide``):

1. snapshot -> free devices, quota usage, shares (``Capacity``, ``QuotaBook``, ``Shares``);
2. triage: unknown project or class (invalid), backoff not over, budget spent with
   ``action: wait``; a spent budget with ``action: lower`` demotes the run's class instead;
3. order: priority class (high first); within a class, the project with the lowest weighted
   dominant share goes next (fair share, recomputed as the cycle admits); within a project,
   shortest max_runtime first (``order: shortest``, the default), submit time (``submit``) or
   least attained service (``las``). The classes are served twice: first, high to low, the
   runs within their project's nominal quota, then, high to low, the runs that borrow, so
   that nothing borrows what its owner takes back at once, whatever their classes (under
   strict FIFO a project whose head borrows waits, whole, for the second pass);
4. fit: for each acceptable GPU type, best-fit placement (``placement.place``) that also
   respects the backfill reservation, and the project's quota (``QuotaBook.problem``; only a
   preemptible run may borrow: a loan must be reclaimable);
5. preempt: a run that does not fit may get victims (``preempt.find_plan``; who may be one:
   ``cycle_victims.may_preempt``). It is admitted in the same decision, on the placement the
   plan found, so no victim is stopped for nothing: the victims hold nothing from then on
   (their devices free, the preemptor's taken), and the controller launches the preemptor once
   they have exited. A victim of the run's own project and class must have reported a
   checkpoint (unless ``preempt_uncheckpointed``) and run ``min_runtime_before_preemption_s``
   (``cycle_victims.ready``). A plan that takes runs of the run's own class is dropped when
   they would win their GPUs back at once (``cycle._keeps_what_it_frees``). Victims of the
   lowest classes go first (``preempt``), so a reclaim ends: a higher-class victim, requeued,
   would preempt its project's lower-class runs in turn. A plan leaves the reservation (6.)
   what backfill leaves it, unless its run is the anchor or of a higher class
   (``cycle_reserve.preempt_hold``);
6. reserve: the anchor (``anchor.anchor``), the run of the highest class that has waited
   longest (submit time, seq, id; not the order's head) among those blocked by capacity or by
   its own project's quota when the cycle begins and that could ever be admitted, or the
   anchor the engine kept from its last cycle (``Snapshot.anchor``) even if it fits now, gets
   an EASY reservation of nodes and quota (``backfill.reserve``; its time is unknown when it
   waits for runs without ``max_runtime``); no other run may take what it waits for unless it
   is shown to end before it, and the anchor itself is never held back by it. Without the kept
   anchor, a run the order prefers would take its GPUs the moment they free. When the cycle
   had no anchor or admitted it, the engine keeps instead the oldest run (highest class first)
   that could ever be admitted and that the cycle overtook, admitting a later run of its class
   and not it (``anchor.overtaken``): one that fits as every cycle begins would else wait
   behind a stream the order prefers for ever, never blocked, never the anchor;
7. explain: every run not admitted gets a reason code, a sentence and, where the runs it
   waits for have ``max_runtime``, an estimated start time (``backfill.EtaBook``); a lender's
   run names the runs holding what it lent, reclaimable or not, and their ends (``lent``).
Strict FIFO: once a project has a blocked run, its later runs wait behind it (a run held only
for the reservation of an older run of its own project does not block it: the anchor is next).

A cycle reads a ``State`` (built once from the snapshot: nothing is kept between cycles but
the anchor, which the engine passes back as ``Snapshot.anchor``) and judges each queue of
interchangeable runs by its head: when the head is blocked and its
followers could do nothing the head could not (no reservation to work around, no possible
victims), they wait for the same reason without being tried one by one.

Every cycle visits every queue and judges every head whose turn comes (``cycle._try``, or
``cycle._surely_blocked`` where the answer is certain): nothing is skipped for having been
blocked before, and nothing is remembered from one cycle to the next but the kept anchor.
This Python core is the plain reference (the tests' oracle, ``simulate --engine reference``
and the engine where the Rust one is not built, ``engines.reference.FromScratch``); speed is
the Rust engine's job (``engines.native``).

Where the steps live: this module is the entry (``decide``, ``decide_keeping``, which calls
the steps in turn, each under its number) and the specification above. Each step is a module
of plain functions over one object, the cycle's books (``cycle_books.CycleBooks``: 1., what
the cycle holds, and 2., the budget's level): ``cycle_reserve`` (the reservation, 6.),
``cycle`` (3., 4. and the preemption of 5.; who may be a victim: ``cycle_victims``) and
``cycle_explain`` (7.).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mlops_gpu.core import cycle, cycle_explain, cycle_reserve, eligibility
from mlops_gpu.core.cycle_books import CycleBooks
from mlops_gpu.core.decision import Decision, PendingReason
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.core.state import State


def decide_default(snap: Snapshot, explain: bool = True) -> Decision:
    """From scratch: build the state from ``snap``, run one cycle, explain every run (unless
    ``explain`` is False: then ``Decision.pending`` is empty)."""
    return decide_keeping(snap, explain)[0]


def decide_keeping(snap: Snapshot, explain: bool = True) -> tuple[Decision, str | None]:
    """``decide_default``, and the anchor an engine applying the decision keeps for the next
    cycle (``Snapshot.anchor``; ``cycle_reserve.kept_anchor``). The policy sees only the runs
    ``eligibility.gate`` passes; the others get its reasons (in the snapshot's order)."""
    # (job control first: holds, begin times, dependencies, array limits keep runs out)
    g = eligibility.gate(snap)
    if g.waiting:
        anchor = snap.anchor if snap.anchor not in g.waiting else None
        d, kept = decide_keeping(replace(snap, pending=g.eligible, anchor=anchor), explain)
        if explain:
            mine = {p.run_id: p for p in d.pending}
            mine.update(g.waiting)
            d = replace(d, pending=tuple(mine[r.id] for r in snap.pending if r.id in mine))
        return replace(d, doomed=g.doomed), kept
    # 1. snapshot -> free devices, quota usage (``State``: ``Capacity``, ``QuotaBook``), and
    # 2. triage: unknown project or class, backoff (``State``); spent budgets (``CycleBooks``)
    books = CycleBooks(State(snap), snap.now, snap.usage_history, snap.spent)
    # 6. reserve: the anchor and its reservation, from the cycle's starting state
    cycle_reserve.work_out(books)
    # 3. order, 4. fit, 5. preempt: each queue head in its turn
    d = cycle.schedule(books)
    # 6. the anchor kept for the next cycle (this one's, or the run it overtook)
    kept = cycle_reserve.kept_anchor(books)
    if not explain:
        return Decision(d.admissions, d.preemptions, ()), kept
    # 7. explain: a reason (and ETA) for every run not admitted
    reasons = {p.run_id: p for p in cycle_explain.explain(books)}
    pending = tuple(reasons[r.id] for r in snap.pending if r.id in reasons)
    return Decision(d.admissions, d.preemptions, pending), kept


POLICIES: dict[str, Callable[[Snapshot, bool], Decision]] = {"default": decide_default}


def decide(snap: Snapshot, explain: bool = True) -> Decision:
    """The scheduling decision for ``snap`` under the policy it names; with ``explain``, a
    reason for every run left pending."""
    return POLICIES[snap.policy.name](snap, explain)


def explain_all(snap: Snapshot) -> tuple[PendingReason, ...]:
    """A reason (and ETA where one can be computed) for every pending run of ``snap``."""
    return decide(snap).pending
