"""Preemption searches that failed for want of capacity, remembered across cycles.

A search for run R fails *for want of capacity* when, on every type R accepts, no node set
could take R even with every run that could ever be its victim gone
(``preempt._could_fit_without_all``, an upper bound: its "no" is certain; "ever": without the
conditions time or a checkpoint can fulfil, ``Cycle._ready``). Such a failure stays true, and
later cycles judge R blocked without trying it at all (``recalls_failure``, asked before
``Cycle._try``: no placement, no quota check, no search), until one of these happens:
- a finished run gives back GPUs of one of R's types, or a run becomes a possible victim, on
  a node where the free whole devices plus what R's pool holds (R's project and the cohort
  members borrowing that type at the cycle's start) now reach R's GPUs per node. Nothing else
  raises that room: an admission takes free devices, and a run admitted by a cycle joins the
  pools only after that cycle (then it is logged: within the cycle it held devices that were
  counted neither free nor in a pool);
- who borrows R's types at the cycle's start, or whether R stays within its nominal quota,
  changes (``key``: they decide who may be a victim);
- the clock goes back.
Runs being preempted hold nothing (their devices are free, logged as released when the engine
marks them); within a cycle, the victims it has chosen so far gave their devices back before
the engine logs it, so at a recall each node they held is checked (``gone_on``), and the search
runs if one reaches the need. The memo is not used under
``order: las`` (attained service makes new victims as time passes; under ``shortest`` victims
only drop out with time), for other than whole-GPU requests, or outside the incremental
engine's cycles (explain passes book and give back without going through ``released``). It
lives in ``State``, so a rebuild (capacity changed) starts it empty.

Invariant: a remembered failure is one the search would find again now; the differential
test (incremental engine against from-scratch cycles, which never use the memo) holds it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from mlops_gpu.core.placement import request_amount
from mlops_gpu.model import Run

if TYPE_CHECKING:
    from mlops_gpu.core.cycle import Cycle

#: Releases kept before the log (and every remembered failure with it) is dropped.
MAX_LOG = 20_000

Key = tuple[tuple[str, tuple[str, ...], bool], ...]  # per type: (type, pool projects, within)


class Entry:
    """A remembered failure: of ``attempt`` of the run, under ``key``, checked against the
    releases logged before absolute position ``pos``, at ``now``. Moved forward in place by
    each recall that finds it still true (a recall is the common case: no allocation)."""

    __slots__ = ("attempt", "key", "now", "pos")

    def __init__(self, attempt: int, key: Key, pos: int, now: float) -> None:
        self.attempt = attempt
        self.key = key
        self.pos = pos
        self.now = now


class SearchMemo:
    def __init__(self, enabled: bool = True) -> None:
        #: False: remember nothing, recall nothing (every search runs; the tests' reference)
        self.enabled = enabled
        self.log: list[tuple[str, tuple[str, ...]]] = []  # (GPU type, nodes) per release
        self.base = 0  # absolute position of log[0]
        #: node -> project -> whole devices held there by possible victims (preemptible
        #: active runs not being preempted), as ``State.running`` counts them.
        self.held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.entries: dict[str, Entry] = {}

    def hold(self, run: Run, sign: int) -> None:
        """``run`` became (+1) or stopped being (-1) a possible victim. Becoming one raises
        the room on its nodes when its devices were taken before (a run admitted by a cycle
        holds its GPUs in that cycle, and joins the pools only after it), so it is logged like
        a release."""
        assert run.placement is not None
        for slot in run.placement.slots:
            on = self.held[slot.node]
            on[run.project] += sign * len(slot.devices)
            if not on[run.project]:
                del on[run.project]
        if sign > 0:
            self.released(run.placement.gpu_type, run.placement.node_names)

    def released(self, gpu_type: str, nodes: tuple[str, ...]) -> None:
        if not self.entries:
            self.base += len(self.log)
            self.log.clear()  # nothing to check against: keep the log short
            return
        self.log.append((gpu_type, nodes))
        if len(self.log) > MAX_LOG:
            self.base += len(self.log)
            self.log.clear()
            self.entries.clear()

    def forget(self, run_id: str) -> None:
        self.entries.pop(run_id, None)

    def remember(self, run: Run, key: Key, now: float) -> None:
        if not self.enabled:
            return
        self.entries[run.id] = Entry(run.attempt, key, self.base + len(self.log), now)

    def fails(
        self,
        run: Run,
        key: Key,
        now: float,
        free: Mapping[str, list[str]],
        gone: Iterable[str] = (),
    ) -> bool:
        """Whether the search for ``run`` surely fails again (``free``: each node's free whole
        devices now; ``gone``: nodes of ``run``'s types whose devices were given back since
        the last release logged, by victims of the cycle under way)."""
        e = self.entries.get(run.id)
        if e is None:
            return False
        if e.attempt != run.attempt or e.key != key or now < e.now or e.pos < self.base:
            del self.entries[run.id]
            return False
        end = self.base + len(self.log)
        gone = tuple(gone)
        if not gone and e.pos == end:  # nothing released since the last check
            e.now = now
            return True
        need = run.request.gpus
        projects = {p for _, pool, _ in key for p in pool}

        def room(node: str) -> int:
            on = self.held.get(node, {})
            return len(free.get(node, ())) + sum(on.get(p, 0) for p in projects)

        if any(room(node) >= need for node in gone):
            return False  # it may fit once they are gone: search (the failure stays known)
        types = {t for t, _, _ in key}
        for gpu_type, nodes in self.log[e.pos - self.base :]:
            if gpu_type not in types:
                continue
            for node in nodes:
                if room(node) >= need:
                    del self.entries[run.id]
                    return False
        # Checked up to here: the next check reads only the releases after this one.
        e.pos, e.now = end, now
        return True


# -- what a cycle asks (``Cycle._turn`` before trying a queue head, ``Cycle._preempt``) -----
def applies(c: Cycle, run: Run) -> bool:
    """Whether failures of ``run``'s search are remembered and recalled in this cycle."""
    return c.park and c.snap.policy.order != "las" and run.request.shape == "whole"


def recalls_failure(c: Cycle, run: Run) -> bool:
    """Whether the memo recalls that ``run`` fits on no node set of its types even with every
    possible victim and every run being preempted gone. Then it also fits nowhere now, and a
    search would find neither victims nor runs to wait for: ``Cycle._try`` would judge it
    blocked, with no side effect but its reason."""
    memo = c.state.memo
    if run.id not in memo.entries or not applies(c, run):
        return False
    types = c.state.types_of(run)
    return memo.fails(run, key_of(c, run, types), c.snap.now, c.cap.free, gone_on(c, types))


def key_of(c: Cycle, run: Run, types: list[str]) -> Key:
    """What decides ``run``'s possible victims besides releases: per type, the projects whose
    runs are in its pool and whether it stays within nominal."""
    root = c.quota.root.get(run.project)
    amount = request_amount(run)
    out = []
    for t in sorted(types):  # (the same key whatever order a cycle tries the types in)
        pool = c.pools.get((run.project, t))
        if pool is None:  # (who borrowed at the cycle's start: fixed for the cycle)
            lenders = c.lenders_at_start(root, t) if root is not None else ()
            pool = (run.project, *(m for m in lenders if m != run.project))
            c.pools[(run.project, t)] = pool
        within = root is not None and c.quota.within_nominal(run.project, t, amount)
        out.append((t, pool, within))
    return tuple(out)


def gone_on(c: Cycle, types: list[str]) -> tuple[str, ...]:
    """The nodes of ``types`` held by the victims this cycle has chosen so far (remembered
    for the cycle until it chooses more: the set only grows within a cycle)."""
    fresh = len(c.going) - len(c.state.going)
    if not fresh:
        return ()
    seen = c.gone.get(tuple(types))
    if seen is not None and seen[0] == len(c.going):
        return seen[1]
    out: set[str] = set()
    for rid in c.going:
        a = None if rid in c.state.going else c.state.active.get(rid)
        if a is not None and a.placement is not None and a.placement.gpu_type in types:
            out.update(a.placement.node_names)
    found = tuple(sorted(out))
    c.gone[tuple(types)] = (len(c.going), found)
    return found
