"""Scale decisions for elastic node pools (``model.pool``): which powered-down nodes to boot,
which idle nodes to power down, and a sentence for every choice.

Pure and deterministic: no I/O, the clock is ``ScaleInputs.now``, ties are broken by node
name, and the same inputs give the same decision.

The rule, per pool:
1. Horizon ``H = now + boot_s``: a new node asked for now takes runs at ``H``. The capacity the
   pool gains by ``H`` is what running runs free by their expected end (``Busy.expected_end``,
   from ``max_runtime``) if that is before ``H``, and booting nodes ready by then; GPUs free now
   do not count (the pending runs are those the core's cycle just left waiting: those GPUs were
   too few for them or are held for a reservation). Pending runs, in the core's queue order, are
   fitted onto that capacity first-fit (a gang on ``nodes`` distinct nodes). A run that fits
   starts on the current nodes no later than on a new one, so it asks for nothing (if it fits
   on a booting node, it is told "waiting for node X to boot (ETA n min)").
2. Runs that do not fit by ``H`` would start later on the current nodes than on a new node: they
   are packed first-fit onto powered-down nodes (in name order), which are booted, within
   ``max_nodes`` and within their project's USD budget: a run that opens a node needs the
   node's whole cost for ``boot_s`` plus its expected runtime left in its project's budget; a
   run that joins a node opened for another pays its GPU share (``budget_left``, what each
   budgeted project may still spend; projects not listed are not capped).
3. An up node with no run, no reservation and no pending run expected on it by ``H``, idle for
   ``idle_s``, is powered down, keeping ``min_nodes`` up or booting; a draining node is powered
   down as soon as it is empty. Pools below ``min_nodes`` boot up to it.
4. Runs that need capacity first bring back draining nodes they fit on (no boot). When nothing
   waits and the other busy up nodes have a whole node's GPUs to spare beyond the pending runs, the
   up node whose runs end first is drained (no new runs), so that it empties and goes: best fit
   alone would still fill it whenever the fuller nodes are full.

Packing: the core's placement is best fit (``core.placement``: the node left with the fewest
free GPUs, then name), so runs fill busy nodes first and others go idle; this module relies on
that and does not move runs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from mlops_gpu.model import NodeState, Pool, PoolNode

#: The runtime assumed for a run with no ``max_runtime`` when pricing a node for it.
UNKNOWN_RUNTIME_S = 3600.0
_NO_NOTES: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Busy:
    """What one running run holds on pool nodes (node -> GPUs), until about ``expected_end``."""

    gpus: tuple[tuple[str, float], ...]
    expected_end: float


@dataclass(frozen=True, slots=True)
class Demand:
    """A pending run that pool ``pool`` could host: ``nodes`` nodes of ``gpus`` GPUs each."""

    run_id: str
    project: str
    pool: str
    gpus: float
    nodes: int = 1
    #: Its expected runtime (``max_runtime``); None: unknown.
    runtime_s: float | None = None


@dataclass(frozen=True)
class ScaleInputs:
    now: float
    pools: Mapping[str, Pool]
    #: Every node of every pool, in any state.
    nodes: tuple[PoolNode, ...]
    busy: tuple[Busy, ...]
    #: Pending runs in the core's queue order (the order it would start them).
    pending: tuple[Demand, ...]
    #: USD each budgeted project may still spend; projects not here are not capped.
    budget_left: Mapping[str, float] = field(default_factory=dict)
    #: Nodes a reservation holds (never powered down).
    reserved: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ScaleDecision:
    boot: tuple[str, ...]
    power_down: tuple[str, ...]
    #: One sentence per choice (and per refusal), in the order they were made.
    reasons: tuple[str, ...]
    #: run id -> why it waits for capacity (a boot, a budget, ``max_nodes``).
    waiting: Mapping[str, str] = field(default_factory=lambda: _NO_NOTES)
    #: The next time an idle node's ``idle_s`` runs out (ask again then), or None.
    next_check_at: float | None = None
    #: Up nodes to take no new runs (so they empty and go), and draining nodes to take runs again.
    drain: tuple[str, ...] = ()
    undrain: tuple[str, ...] = ()

    def scale_up(self, nodes: tuple[PoolNode, ...]) -> dict[str, int]:
        """Nodes booted per pool."""
        pool_of = {n.name: n.pool for n in nodes}
        out: dict[str, int] = defaultdict(int)
        for name in self.boot:
            out[pool_of[name]] += 1
        return dict(out)


def minutes(seconds: float) -> str:
    """``"2 min"``, ``"1.5 h"``: a duration for a reason sentence."""
    if seconds < 5400:
        return f"{max(0, math.ceil(seconds / 60))} min"
    return f"{seconds / 3600:.1f} h"


def _fit(free: dict[str, float], order: list[str], d: Demand) -> list[str] | None:
    """First fit of ``d``'s gang on ``free`` (node -> GPUs) in ``order``; the nodes or None."""
    chosen = [n for n in order if free[n] >= d.gpus - 1e-9][: d.nodes]
    return chosen if len(chosen) == d.nodes else None


class _PoolScaler:
    """One pool's decision (the rule of the module docstring)."""

    def __init__(self, pool: Pool, inputs: ScaleInputs, budget: dict[str, float]) -> None:
        self.pool, self.inputs, self.budget = pool, inputs, budget
        self.now = inputs.now
        self.horizon = inputs.now + pool.boot_s
        self.nodes = sorted((n for n in inputs.nodes if n.pool == pool.name), key=lambda n: n.name)
        self.reasons: list[str] = []
        self.waiting: dict[str, str] = {}
        self.boot: list[str] = []
        self.down: list[str] = []
        self.drain: list[str] = []
        self.undrain: list[str] = []
        #: nodes a pending run is expected to start on by the horizon
        self.expected: set[str] = set()

    def _by_horizon(self) -> dict[str, float]:
        """GPUs that become free by the horizon (node -> GPUs): what running runs free by
        their expected end, and booting nodes ready by then. GPUs free now do not count: the
        pending runs are what the core's cycle just left waiting, so those GPUs were too few
        or are held for a reservation."""
        free: dict[str, float] = {}
        for n in self.nodes:
            if n.state is NodeState.UP:
                free[n.name] = 0.0
            elif n.state is NodeState.BOOTING and (n.ready_at or self.now) <= self.horizon:
                free[n.name] = float(self.pool.gpus_per_node)
        for b in self.inputs.busy:
            for node, gpus in b.gpus:
                if node in free and b.expected_end <= self.horizon:
                    free[node] += gpus
        return free

    def decide(self, pending: list[Demand]) -> None:
        states = {n.name: n for n in self.nodes}
        free = self._by_horizon()
        order = sorted(free)
        later: list[Demand] = []
        for d in pending:
            got = _fit(free, order, d)
            if got is None:
                later.append(d)
                continue
            for n in got:
                free[n] -= d.gpus
                self.expected.add(n)
            booting = [n for n in got if states[n].state is NodeState.BOOTING]
            if booting:
                eta = max(states[n].ready_at or self.now for n in booting)
                self.waiting[d.run_id] = (
                    f"waiting for node {booting[0]} to boot (ETA {minutes(eta - self.now)})"
                )
        later = self._undrain(later)
        self._scale_up(later)
        if not later and not self.boot:
            self._consolidate(pending)
        self._scale_down()

    def _held(self) -> tuple[dict[str, float], dict[str, float]]:
        """GPUs held now, and the latest expected end of the runs there, per node."""
        held: dict[str, float] = defaultdict(float)
        ends: dict[str, float] = defaultdict(float)
        for b in self.inputs.busy:
            for node, gpus in b.gpus:
                held[node] += gpus
                ends[node] = max(ends[node], b.expected_end)
        return held, ends

    def _undrain(self, later: list[Demand]) -> list[Demand]:
        """Runs that fit on draining nodes now bring those nodes back (no boot needed); the
        runs that still need capacity."""
        draining = [n.name for n in self.nodes if n.state is NodeState.DRAINING]
        if not draining or not later:
            return later
        held, _ = self._held()
        free = {n: self.pool.gpus_per_node - held[n] for n in draining}
        rest = []
        for d in later:
            got = _fit(free, draining, d)
            if got is None:
                rest.append(d)
                continue
            for n in got:
                free[n] -= d.gpus
                if n not in self.undrain:
                    self.undrain.append(n)
                    self.reasons.append(
                        f"returning draining node {n} to service for run {d.run_id} "
                        "(sooner than booting a node)"
                    )
        return rest

    def _consolidate(self, pending: list[Demand]) -> None:
        """Nothing waits for capacity: drain the up node whose runs end first, if the other busy
        up nodes have a whole node's GPUs free beyond the pending runs, so that new runs go to the
        others and it empties and powers down."""
        pool = self.pool
        held, ends = self._held()
        up = [n.name for n in self.nodes if n.state is NodeState.UP]
        if len(up) - 1 < max(pool.min_nodes, 1):
            return
        wanted = sum(d.gpus * d.nodes for d in pending)
        # spare GPUs on the other busy nodes only: empty ones are on their way out
        busy = [n for n in up if held[n] > 1e-9]
        free = sum(pool.gpus_per_node - held[n] for n in busy)
        cands = [n for n in busy if n not in self.inputs.reserved and n not in self.expected]
        if not cands:
            return
        best = min(cands, key=lambda n: (ends[n], held[n], n))
        slack = free - (pool.gpus_per_node - held[best]) - wanted
        if slack < pool.gpus_per_node:
            return
        self.drain.append(best)
        self.reasons.append(
            f"draining node {best}: its runs end by about {minutes(ends[best] - self.now)} from "
            f"now and the other busy nodes have {slack:g} GPUs to spare"
        )

    def _scale_up(self, later: list[Demand]) -> None:
        pool = self.pool
        live = [n for n in self.nodes if n.state is not NodeState.POWERED_DOWN]
        spare = [n.name for n in self.nodes if n.state is NodeState.POWERED_DOWN]
        room = min(len(spare), pool.max_nodes - len(live))
        below_min = max(
            0, pool.min_nodes - sum(1 for n in live if n.state is not NodeState.DRAINING)
        )
        for name in spare[: min(below_min, room)]:
            self.boot.append(name)
            self.reasons.append(
                f"booting node {name}: pool {pool.name} is below min_nodes ({pool.min_nodes})"
            )
        fresh: dict[str, float] = {n: float(pool.gpus_per_node) for n in self.boot}
        at_max = False
        eta = minutes(pool.boot_s)
        for d in later:
            # new nodes of this decision with room first, then as many more as the gang needs
            shared = [n for n in fresh if fresh[n] >= d.gpus - 1e-9][: d.nodes]
            opened = d.nodes - len(shared)
            if opened and len(self.boot) + opened > room:
                if not at_max:
                    self.reasons.append(
                        f"not scaling up pool {pool.name} for run {d.run_id}: at max_nodes "
                        f"({pool.max_nodes} up or booting)"
                    )
                at_max = True
                self.waiting[d.run_id] = (
                    f"waiting for capacity: pool {pool.name} is at max_nodes ({pool.max_nodes})"
                )
                continue
            hours_s = pool.boot_s + (d.runtime_s if d.runtime_s is not None else UNKNOWN_RUNTIME_S)
            cost = pool.node_cost(hours_s) * (
                opened + d.gpus * (d.nodes - opened) / pool.gpus_per_node
            )
            left = self.budget.get(d.project)
            if left is not None and cost > left + 1e-9:
                self.reasons.append(
                    f"not scaling up for run {d.run_id}: project {d.project}'s budget has "
                    f"${left:.2f} left, its node time would cost ${cost:.2f}"
                )
                self.waiting[d.run_id] = (
                    f"not scaling up: project {d.project}'s budget has ${left:.2f} left"
                )
                continue
            if left is not None:
                self.budget[d.project] = left - cost
            new = spare[len(self.boot) : len(self.boot) + opened]
            for name in new:
                self.boot.append(name)
                fresh[name] = float(pool.gpus_per_node)
                self.reasons.append(
                    f"booting node {name} for run {d.run_id}: it would start later on the "
                    f"current nodes than on a new one (ready in {eta})"
                )
            for name in shared + new:
                fresh[name] -= d.gpus
            self.waiting[d.run_id] = f"waiting for node {(shared + new)[0]} to boot (ETA {eta})"

    def _scale_down(self) -> None:
        pool = self.pool
        keep = sum(1 for n in self.nodes if n.state in (NodeState.UP, NodeState.BOOTING))
        keep += len(self.boot)
        idle = [
            n
            for n in self.nodes
            if n.state in (NodeState.UP, NodeState.DRAINING) and n.idle_since is not None
        ]
        idle.sort(key=lambda n: (n.state is not NodeState.DRAINING, n.idle_since, n.name))
        for n in idle:
            if n.name in self.undrain:
                continue
            if n.state is NodeState.DRAINING:
                self.down.append(n.name)
                self.reasons.append(f"powering down node {n.name}: drained and empty")
                continue
            assert n.idle_since is not None
            quiet = self.now - n.idle_since
            if quiet < pool.idle_s or n.name in self.inputs.reserved or n.name in self.expected:
                continue
            if keep <= pool.min_nodes:
                break
            keep -= 1
            self.down.append(n.name)
            self.reasons.append(
                f"powering down node {n.name}: idle for {minutes(quiet)} "
                f"(idle_s {minutes(pool.idle_s)}), no run or reservation"
            )

    def next_check(self) -> float | None:
        gone = set(self.down)
        times = [
            n.idle_since + self.pool.idle_s
            for n in self.nodes
            if n.state is NodeState.UP
            and n.idle_since is not None
            and n.name not in gone
            and n.idle_since + self.pool.idle_s > self.now
        ]
        return min(times, default=None)


def decide_scale(inputs: ScaleInputs) -> ScaleDecision:
    """The pools' scale decision for ``inputs`` (the rule of the module docstring)."""
    budget = dict(inputs.budget_left)
    by_pool: dict[str, list[Demand]] = defaultdict(list)
    for d in inputs.pending:
        by_pool[d.pool].append(d)
    boot: list[str] = []
    down: list[str] = []
    reasons: list[str] = []
    waiting: dict[str, str] = {}
    checks: list[float] = []
    drain: list[str] = []
    undrain: list[str] = []
    for name in sorted(inputs.pools):
        s = _PoolScaler(inputs.pools[name], inputs, budget)
        s.decide(by_pool.get(name, []))
        boot += s.boot
        down += s.down
        drain += s.drain
        undrain += s.undrain
        reasons += s.reasons
        waiting.update(s.waiting)
        if (t := s.next_check()) is not None:
            checks.append(t)
    for d in inputs.pending:
        if d.pool not in inputs.pools:
            waiting[d.run_id] = f"no pool named {d.pool}"
    return ScaleDecision(
        tuple(boot),
        tuple(down),
        tuple(reasons),
        MappingProxyType(waiting),
        min(checks, default=None),
        tuple(drain),
        tuple(undrain),
    )
