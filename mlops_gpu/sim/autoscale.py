"""The simulator with an elastic pool: ``max_nodes`` nodes that are powered down, booting or up,
scaled by a scaler after every event time's cycles.

Scalers:
- ``ours``: ``core.autoscale.decide_scale`` (boots only for runs that would start later on the
  current nodes than on a new node; powers down after the pool's ``idle_s``);
- ``reactive``: the usual cluster-autoscaler behaviour, a baseline: as soon as anything waits,
  boot enough nodes for the pending demand (its GPUs over ``gpus_per_node``, less the nodes
  already booting); power a node down after ``REACTIVE_IDLE_S`` idle;
- ``always-on``: every node up from the start (no scaling; what a fixed cluster costs).

Invariants: a node is billed from the moment it starts booting until it is powered down (the
last open interval closes at the last event time), so ``node_hours`` counts booting time; a
node with a run on it is never powered down; at most ``max_nodes`` nodes exist; the core sees
only up nodes as schedulable (``set_nodes`` of either engine, ``FromScratch`` or
``NativeEngine``: the same decisions, so the same rows; ``engine`` chooses as ``Simulation``
does, native where installed). ``extra`` of the result gains ``node_hours``, ``cost_usd``,
``scale_ups`` and ``scale_downs``.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mlops_gpu.core.autoscale import Busy, Demand, ScaleDecision, ScaleInputs, decide_scale
from mlops_gpu.model import NodeState, Pool, PoolNode
from mlops_gpu.sim.simulator import Cluster, SimResult, Simulation
from mlops_gpu.sim.trace import Trace

SCALERS = ("ours", "reactive", "always-on")
#: cluster-autoscaler's default ``scale-down-unneeded-time``
REACTIVE_IDLE_S = 600.0
#: pending runs the scaler is shown, in GPUs: beyond twice the pool, every node is wanted anyway
DEMAND_WINDOW = 2


def reactive_scale(inputs: ScaleInputs, idle_s: float = REACTIVE_IDLE_S) -> ScaleDecision:
    """The reactive baseline's decision (the module docstring), for one or more pools."""
    boot: list[str] = []
    down: list[str] = []
    reasons: list[str] = []
    checks: list[float] = []
    demand: dict[str, float] = defaultdict(float)
    for d in inputs.pending:
        demand[d.pool] += d.gpus * d.nodes
    for name in sorted(inputs.pools):
        pool = inputs.pools[name]
        nodes = sorted((n for n in inputs.nodes if n.pool == name), key=lambda n: n.name)
        spare = [n.name for n in nodes if n.state is NodeState.POWERED_DOWN]
        live = len(nodes) - len(spare)
        booting = sum(1 for n in nodes if n.state is NodeState.BOOTING)
        want = max(math.ceil(demand[name] / pool.gpus_per_node) - booting, 0)
        want = max(want, pool.min_nodes - live)
        new = spare[: max(0, min(want, pool.max_nodes - live))]
        boot += new
        reasons += [f"booting node {n}: runs wait for {demand[name]:g} GPUs" for n in new]
        keep = live + len(new)
        for n in sorted(
            (n for n in nodes if n.state is NodeState.UP and n.idle_since is not None),
            key=lambda n: (n.idle_since, n.name),
        ):
            assert n.idle_since is not None
            if inputs.now - n.idle_since >= idle_s and keep > pool.min_nodes:
                keep -= 1
                down.append(n.name)
                reasons.append(f"powering down node {n.name}: idle for {idle_s:g} s")
            elif n.idle_since + idle_s > inputs.now:
                checks.append(n.idle_since + idle_s)
    return ScaleDecision(
        tuple(boot), tuple(down), tuple(reasons), next_check_at=min(checks, default=None)
    )


class AutoscaleSimulation(Simulation):
    """A replay on ``pool`` (its ``max_nodes`` x ``gpus_per_node`` GPUs) under ``scaler``."""

    def __init__(
        self, trace: Trace, pool: Pool, policy: str, scaler: str, engine: str = "auto"
    ) -> None:
        if scaler not in SCALERS:
            raise ValueError(f"scaler: expected one of {', '.join(SCALERS)}, got {scaler!r}")
        cluster = Cluster(pool.max_nodes, pool.gpus_per_node, gpu_type=pool.gpu_type)
        # (the simulator's engine is job control, ``Gated``, in front of the chosen engine)
        super().__init__(trace, cluster, policy, engine=engine)
        self.pool, self.scaler = pool, scaler
        self.models = {n.name: n for n in cluster.model_nodes()}
        first = 0.0 if not trace.jobs else trace.jobs[0].submit_s
        on = pool.max_nodes if scaler == "always-on" else pool.min_nodes
        names = sorted(self.models)
        self.state = {
            n: NodeState.UP if k < on else NodeState.POWERED_DOWN for k, n in enumerate(names)
        }
        self.idle_since: dict[str, float | None] = {n: first for n in names[:on]}
        self.billed_from: dict[str, float] = {n: first for n in names[:on]}
        self.node_s = 0.0
        self.ready: list[tuple[float, str]] = []
        self.ready_at: dict[str, float] = {}
        self.check_at = math.inf
        self.last = first
        self.scale_ups = self.scale_downs = 0
        self.reasons: list[str] = []
        self._publish(first)

    def _publish(self, now: float) -> None:
        nodes = tuple(
            m if self.state[n] is NodeState.UP else replace(m, schedulable=False)
            for n, m in self.models.items()
        )
        self.engine.inner.set_nodes(nodes, now)

    def _next_event(self) -> float:
        return min(self.ready[0][0] if self.ready else math.inf, self.check_at)

    def _before_cycles(self, now: float) -> None:
        self.last = max(self.last, now)
        changed = False
        while self.ready and self.ready[0][0] <= now:
            _, name = heapq.heappop(self.ready)
            self.state[name] = NodeState.UP
            self.idle_since[name] = now
            del self.ready_at[name]
            changed = True
        if changed:
            self._publish(now)

    def _held(self) -> dict[str, float]:
        held: dict[str, float] = defaultdict(float)
        for run in self.engine.active.values():
            if run.placement is not None:
                for slot in run.placement.slots:
                    held[slot.node] += slot.amount
        return held

    def _inputs(self, now: float, held: dict[str, float]) -> ScaleInputs:
        nodes = tuple(
            PoolNode(
                n,
                self.pool.name,
                s,
                ready_at=self.ready_at.get(n),
                idle_since=self.idle_since.get(n)
                if s in (NodeState.UP, NodeState.DRAINING)
                else None,
            )
            for n, s in self.state.items()
        )
        busy = tuple(
            Busy(
                tuple((slot.node, slot.amount) for slot in run.placement.slots),
                (run.started_at or now) + (run.spec.max_runtime_s or 0.0),
            )
            for run in self.engine.active.values()
            if run.placement is not None
        )
        pending: list[Demand] = []
        window = DEMAND_WINDOW * self.pool.max_nodes * self.pool.gpus_per_node
        total = 0.0
        # the runs the policy may start now: not held, waiting on a dependency, a begin time
        # or an array's limit (``Gated.inner``), which no new node would start
        for run in self.engine.inner.pending.values():
            req = run.request
            gpus = req.gpu_fraction if req.gpu_fraction is not None else float(req.gpus)
            pending.append(
                Demand(run.id, run.project, self.pool.name, gpus, req.nodes, run.spec.max_runtime_s)
            )
            total += gpus * req.nodes
            if total >= window:
                break
        return ScaleInputs(now, {self.pool.name: self.pool}, nodes, busy, tuple(pending))

    def _after_cycles(self, now: float) -> None:
        self.last = max(self.last, now)
        held = self._held()
        for n, s in self.state.items():
            if s in (NodeState.UP, NodeState.DRAINING):
                if held.get(n, 0.0) > 1e-9:
                    self.idle_since[n] = None
                elif self.idle_since.get(n) is None:
                    self.idle_since[n] = now
        if self.scaler == "always-on":
            return
        inputs = self._inputs(now, held)
        d = decide_scale(inputs) if self.scaler == "ours" else reactive_scale(inputs)
        for n in d.boot:
            self.state[n] = NodeState.BOOTING
            self.ready_at[n] = now + self.pool.boot_s
            heapq.heappush(self.ready, (now + self.pool.boot_s, n))
            self.billed_from[n] = now
        for n in d.power_down:
            assert held.get(n, 0.0) <= 1e-9, f"{n} powered down with runs on it"
            self.state[n] = NodeState.POWERED_DOWN
            self.idle_since.pop(n, None)
            self.node_s += now - self.billed_from.pop(n)
        self.scale_ups += len(d.boot)
        self.scale_downs += len(d.power_down)
        self.check_at = d.next_check_at if d.next_check_at is not None else math.inf
        for n in d.drain:
            self.state[n] = NodeState.DRAINING
        for n in d.undrain:
            self.state[n] = NodeState.UP
        if d.power_down or d.drain or d.undrain:
            self._publish(now)
        if d.undrain:  # the runs it came back for start now, not at the next event
            self._cycle(now)
        if len(self.reasons) < 50:  # a sample of the sentences, for tests and --json
            self.reasons += d.reasons[: 50 - len(self.reasons)]

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        r = super().run(progress)
        end = max([self.last] + [o.finish for o in self.out.values() if o.finish is not None])
        node_s = self.node_s + sum(end - t for t in self.billed_from.values())
        r.policy = f"{r.policy}+{self.scaler}"
        r.extra.update(
            node_hours=node_s / 3600.0,
            cost_usd=node_s / 3600.0 * self.pool.price_per_node_hour,
            scale_ups=float(self.scale_ups),
            scale_downs=float(self.scale_downs),
        )
        return r


def simulate_pool(
    trace: Trace,
    pool: Pool,
    scaler: str,
    policy: str = "default",
    progress: Callable[[int, int], None] | None = None,
    engine: str = "auto",
) -> SimResult:
    """Replay ``trace`` on ``pool`` under ``policy`` with ``scaler`` (``SCALERS``) on
    ``engine`` (``engines.ENGINES``)."""
    return AutoscaleSimulation(trace, pool, policy, scaler, engine).run(progress)


def compare_scalers(
    trace: Trace,
    pool: Pool,
    policy: str = "default",
    scalers: tuple[str, ...] = SCALERS,
    done: Callable[[SimResult], None] | None = None,
    engine: str = "auto",
) -> dict[str, Any]:
    """Each scaler's replay of ``trace`` on ``pool``: the object ``simulate --autoscale --json``
    prints, one row per scaler (``summarize``'s keys plus ``node_hours``, ``cost_usd``,
    ``scale_ups``, ``scale_downs``)."""
    from mlops_gpu.sim.metrics import summarize

    rows = []
    for s in scalers:
        r = simulate_pool(trace, pool, s, policy, engine=engine)
        if done is not None:
            done(r)
        row = summarize(r)
        row.update(
            scaler=s,
            engine=r.engine,
            node_hours=r.extra["node_hours"],
            cost_usd=r.extra["cost_usd"],
            scale_ups=int(r.extra["scale_ups"]),
            scale_downs=int(r.extra["scale_downs"]),
        )
        rows.append(row)
    return {
        "trace": trace.name,
        "pool": {
            "name": pool.name,
            "gpus_per_node": pool.gpus_per_node,
            "min_nodes": pool.min_nodes,
            "max_nodes": pool.max_nodes,
            "boot_s": pool.boot_s,
            "price_per_node_hour": pool.price_per_node_hour,
            "idle_s": pool.idle_s,
        },
        "jobs": len(trace.jobs),
        "results": rows,
    }
