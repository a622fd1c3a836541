"""Elastic pools in the live scheduler: the scale decisions of ``core.autoscale`` acted on
through a backend's own power saving (Slurm's ``SuspendProgram``/``ResumeProgram``) or, on
Kubernetes, through an autoscaler shown placeholder pods (``backends.k8s_capacity``).

How a tick uses it:
1. ``open``: the core sees a pool's powered-down nodes as unschedulable (the backend lists them
   so), except those a scale decision chose to boot ("opened"): they are offered to the core as
   schedulable, so it places the waiting runs there; Slurm resumes a powered-down node when a job
   pinned to it is allocated, and runs the job once the node is up.
2. ``explain``: after the core's cycle, the runs it left waiting for capacity (reason
   ``no_capacity``, ``reserved`` or ``unschedulable``) that a pool could host are its demand;
   ``decide_scale`` says which powered-down nodes to boot (only for runs that would start later
   on the current nodes than on a new one, within ``max_nodes``) and why each run waits. Those
   sentences replace the core's reasons (``mlops-gpu queue`` shows them), with the boot in the
   ETA; the decision's own reasons are logged once each.

Kubernetes (a backend with ``capacity``): nodes do not exist until the autoscaler adds them, so
the pool's nodes are its labelled nodes plus slots (``<pool>/new-<i>``, up to ``max_nodes``): a
slot is ``powered_down``, or ``booting`` while its placeholder pod waits for a node. A boot
decided for a slot creates its placeholder (no node is offered to the core: the runs wait
until the new node is in the inventory, then the core places them); ``open`` first deletes the
placeholders whose node is up (so the runs take its GPUs) or that waited too long. A node
whose GPUs a placeholder may still hold (``releasing``: one is bound there, or its deletion is
not confirmed by a later list) is not offered to the core: it is listed unschedulable (reason
``k8s_capacity.RELEASING``) until the placeholder is gone, so no run pinned there is refused by
the kubelet for want of GPUs. Scaling down is the autoscaler's (Karpenter's consolidation of
empty nodes).

Invariants:
- Only pools whose backend reports power states (``power_states()``: Slurm) or has
  ``capacity`` (Kubernetes) are acted on. A Slurm pool's nodes are the backend's power-managed
  nodes of the pool's GPU type; a node down or failed (a resume that timed out) is no pool
  node, so nothing waits on it.
- Powering down is the backend's: Slurm suspends a node idle for its ``SuspendTime`` (set it to
  the pool's ``idle_s``); ``min_nodes`` and draining are not acted on (Slurm resumes nodes for
  jobs only).
- Other pools' placeholders (pools removed from the config) are swept once per change of the
  config's pools; a sweep the cluster's API refuses is retried with a doubling wait up to
  ``SWEEP_MAX_S``, and logged once per outage.
- An opened node stays open until the backend reports it booting or up, or ``boot_s`` plus
  ``OPEN_GRACE_S`` passed (the run it was opened for went elsewhere, or was cancelled).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from mlops_gpu.backends.k8s_capacity import RELEASING
from mlops_gpu.config.pools import acted_on
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.core.autoscale import Busy, Demand, ScaleInputs, decide_scale
from mlops_gpu.core.decision import PendingReason, ReasonCode
from mlops_gpu.model import Node, NodeState, Pool, PoolNode, Run


@runtime_checkable
class Capacity(Protocol):
    """A backend's way to ask an autoscaler for nodes (``backends.k8s_capacity.Placeholders``):
    the pool's nodes and slots, clean-up before the cycle, and asks for slots (slot -> runs)."""

    def pool_nodes(self, pool: Pool, nodes: Sequence[Node], now: float) -> list[PoolNode]: ...
    def settle(self, pool: Pool, nodes: Sequence[Node], now: float) -> None: ...
    def ask(self, pool: Pool, slots: Mapping[str, Sequence[str]], now: float) -> None: ...
    def forget_others(self, pools: Iterable[Pool]) -> bool: ...
    def releasing(self) -> set[str]: ...


log = logging.getLogger("mlops_gpu.controller")

#: How long past ``boot_s`` an opened node waits for a run before it is closed again.
OPEN_GRACE_S = 60.0
#: The first wait before another try of a failed placeholder sweep, and the longest.
SWEEP_FIRST_S, SWEEP_MAX_S = 1.0, 60.0
#: Reasons of runs a new node could start (the others wait for a quota, a budget, a hold...).
CAPACITY_CODES = frozenset({ReasonCode.NO_CAPACITY, ReasonCode.RESERVED, ReasonCode.UNSCHEDULABLE})
_BOOT_WAIT = re.compile(r"waiting for node (\S+) to boot")
T = TypeVar("T")


class PoolControl:
    """The pools of ``rt``'s config that its backends can power up and down."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: node -> when a decision chose to boot it (it is offered to the core since)
        self.opened: dict[str, float] = {}
        #: node -> when it was first seen booting (its ETA: that plus ``boot_s``)
        self._booting_since: dict[str, float] = {}
        self._said: tuple[str, ...] = ()
        #: the pools (name -> backend) at the last sweep of other pools' placeholders
        self._swept: dict[str, str] | None = None
        #: while sweeps fail (the API down): the wait before the next try, and when that is
        self._sweep_wait = 0.0
        self._sweep_at = -math.inf

    def pools(self) -> dict[str, Pool]:
        cfg = self.rt.cfg
        out = {}
        for name in acted_on(cfg.pools, cfg.backends):
            p = cfg.pools[name]
            if self._states(p.backend) is not None or self._capacity(p.backend) is not None:
                out[name] = p.model(name)
        return out

    def _capacity(self, backend: str) -> Capacity | None:
        """The backend's placeholder pods (``k8s_capacity.Placeholders``), if it has any."""
        cap = getattr(self.rt.backends.get(backend), "capacity", None)
        return cap if isinstance(cap, Capacity) else None

    def _states(self, backend: str) -> Callable[[], dict[str, NodeState]] | None:
        b = self.rt.backends.get(backend)
        fn = getattr(b, "power_states", None)
        return fn if callable(fn) else None

    def _nodes(
        self, pools: Mapping[str, Pool], nodes: Sequence[Node], now: float
    ) -> list[PoolNode]:
        """Every pool's nodes in their states; opened powered-down nodes count as booting."""
        out = []
        for p in pools.values():
            if (cap := self._capacity(p.backend)) is not None:
                out += _quietly(f"pool {p.name}: listing placeholders", cap.pool_nodes, p, nodes,
                                now) or []  # fmt: skip
                continue
            fn = self._states(p.backend)
            states = fn() if fn is not None else {}
            for n in sorted(nodes, key=lambda n: n.name):
                st = states.get(n.name)
                if n.backend != p.backend or n.gpu_type != p.gpu_type or st is None:
                    continue
                ready = None
                if st is NodeState.BOOTING:
                    ready = self._booting_since.setdefault(n.name, now) + p.boot_s
                else:
                    self._booting_since.pop(n.name, None)
                if st is NodeState.POWERED_DOWN and n.name in self.opened:
                    st, ready = NodeState.BOOTING, self.opened[n.name] + p.boot_s
                out.append(PoolNode(n.name, p.name, st, ready_at=ready))
        return out

    # -- 1. before the cycle ------------------------------------------------------------
    def open(self, nodes: tuple[Node, ...], now: float) -> tuple[Node, ...]:
        """``nodes`` with the opened powered-down nodes schedulable (the others stay as the
        backend lists them; ``nodes`` itself when none is open); opened nodes that booted or
        waited too long are closed."""
        pools = self.pools()
        if {n: p.backend for n, p in pools.items()} != self._swept and now >= self._sweep_at:
            self._sweep(pools, now)  # first tick, or the config's pools changed
        if not pools and not self.opened:
            return nodes
        still: dict[str, float] = {}  # opened nodes the backend still lists powered down
        held: set[str] = set()  # nodes whose GPUs a placeholder may still hold
        for p in pools.values():
            if (cap := self._capacity(p.backend)) is not None:
                # placeholders whose node is up (or that no node took)
                _quietly(f"pool {p.name}: removing placeholders", cap.settle, p, nodes, now)
                held |= cap.releasing()  # (also where settle failed: the last list's)
                continue
            fn = self._states(p.backend)
            states = fn() if fn is not None else {}
            for n in nodes:
                at = self.opened.get(n.name)
                if (at is not None and n.backend == p.backend and n.gpu_type == p.gpu_type
                        and states.get(n.name) is NodeState.POWERED_DOWN
                        and now - at <= p.boot_s + OPEN_GRACE_S):  # fmt: skip
                    still[n.name] = at
        for name, at in self.opened.items():
            if name not in still:  # booting now (or given up): its ETA counts from the decision
                self._booting_since.setdefault(name, at)
        self.opened = still
        held &= {n.name for n in nodes if n.schedulable}
        if not still and not held:
            return nodes
        return tuple(
            replace(n, schedulable=True, state_reason="") if n.name in self.opened
            else replace(n, schedulable=False, state_reason=RELEASING) if n.name in held
            else n
            for n in nodes
        )  # fmt: skip

    def _sweep(self, pools: Mapping[str, Pool], now: float) -> None:
        """Delete the placeholders of pools no longer acted on (``forget_others``), once per
        change of the config's pools. While that fails (the cluster's API down) it is tried
        again after a wait that doubles from ``SWEEP_FIRST_S`` up to ``SWEEP_MAX_S``, and the
        outage is logged once: as it starts (warning), and as it ends (info)."""
        failed = ""
        for bname in self.rt.backends:
            if (cap := self._capacity(bname)) is not None:
                try:
                    cap.forget_others([p for p in pools.values() if p.backend == bname])
                except RuntimeError as e:  # (the backend's API error)
                    failed = f"backend {bname}: {e}"
        if not failed:
            if self._sweep_wait:
                log.info("pools: other pools' placeholders removed (the cluster answers again)")
            self._swept = {n: p.backend for n, p in pools.items()}
            self._sweep_wait, self._sweep_at = 0.0, -math.inf
            return
        if not self._sweep_wait:
            log.warning("pools: removing other pools' placeholders failed (%s); trying again "
                        "every %.0f s at most, not logged again until it succeeds", failed,
                        SWEEP_MAX_S)  # fmt: skip
        self._sweep_wait = min(SWEEP_MAX_S, max(SWEEP_FIRST_S, 2 * self._sweep_wait))
        self._sweep_at = now + self._sweep_wait

    # -- 2. after the cycle -------------------------------------------------------------
    def explain(
        self,
        now: float,
        reasons: list[PendingReason],
        runs: Mapping[str, Run],
        active: Sequence[Run],
        nodes: Sequence[Node],
        spent: Mapping[str, tuple[float, float]] | None = None,
    ) -> list[PendingReason]:
        """Decide the pools' boots for the runs ``reasons`` leave waiting for capacity, and
        return ``reasons`` with each such run's wait told in the pools' words. ``spent``:
        (GPU-hours, USD) per budgeted project in its window (``accounting.spent``), so that no
        node is booted that a project's USD budget cannot pay for."""
        pools = self.pools()
        if not pools:
            return reasons
        pnodes = self._nodes(pools, nodes, now)
        names = {n.name for n in pnodes}
        pending = []
        for r in reasons:
            run = runs.get(r.run_id)
            if run is None or r.reason_code not in CAPACITY_CODES:
                continue
            pool = _pool_for(run, pools)
            if pool is not None:
                req = run.spec.request
                pending.append(Demand(run.id, run.spec.project, pool.name, float(req.gpus),
                                      req.nodes, run.spec.max_runtime_s))  # fmt: skip
        busy = tuple(_busy(run, names, now) for run in active if _on(run, names))
        left = self._budget_left(spent or {})
        d = decide_scale(ScaleInputs(now, pools, tuple(pnodes), busy, tuple(pending), left))
        self._boot(d.boot, d.waiting, pools, pnodes, now)
        acted = tuple(r for r in d.reasons if not r.startswith(("powering down", "draining")))
        if acted and acted != self._said:
            for line in acted:
                log.info("pools: %s", line)
        self._said = acted
        ready = {n.name: n.ready_at for n in pnodes}
        boot_s = {n.name: pools[n.pool].boot_s for n in pnodes}
        out = []
        for r in reasons:
            text = d.waiting.get(r.run_id)
            if text is None:
                out.append(r)
                continue
            eta = r.eta
            if (m := _BOOT_WAIT.match(text)) is not None:
                node = m.group(1)
                eta = ready.get(node) or now + boot_s.get(node, 0.0)
            out.append(replace(r, reason=text, eta=eta))
        return out

    def _boot(
        self,
        boot: Sequence[str],
        waiting: Mapping[str, str],
        pools: Mapping[str, Pool],
        pnodes: Sequence[PoolNode],
        now: float,
    ) -> None:
        """Act on the nodes a decision boots: a powered-down Slurm node is opened (offered to
        the core); a Kubernetes slot gets its placeholder pod, naming the runs that wait for
        it."""
        pool_of = {n.name: pools[n.pool] for n in pnodes}
        asks: dict[str, dict[str, list[str]]] = {}  # pool -> slot -> runs
        for name in boot:
            pool = pool_of[name]
            if self._capacity(pool.backend) is None:
                self.opened.setdefault(name, now)
            else:
                asks.setdefault(pool.name, {})[name] = []
        for run_id, text in waiting.items():
            m = _BOOT_WAIT.match(text)
            if m is not None and (p := pool_of.get(m.group(1))) is not None:
                asks.get(p.name, {}).get(m.group(1), []).append(run_id)
        for name, slots in asks.items():
            cap = self._capacity(pools[name].backend)
            assert cap is not None
            _quietly(f"pool {name}: creating placeholders", cap.ask, pools[name], slots, now)

    def _budget_left(self, spent: Mapping[str, tuple[float, float]]) -> dict[str, float]:
        """USD each project with a USD budget may still spend in its window."""
        out = {}
        for name, p in self.rt.cfg.model_projects().items():
            if p.budget is not None and p.budget.usd is not None:
                out[name] = max(0.0, p.budget.usd - spent.get(name, (0.0, 0.0))[1])
        return out


def _quietly(what: str, fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)``, or None with a warning where the cluster does not answer (the backend's
    API error): the tick goes on, and the next one tries again."""
    try:
        return fn(*args)
    except RuntimeError as e:
        log.warning("%s failed: %s", what, e)
        return None


def _pool_for(run: Run, pools: Mapping[str, Pool]) -> Pool | None:
    """The first pool (by name) that could host ``run``: its GPU type and backend, whole GPUs."""
    req, spec = run.spec.request, run.spec
    if req.shape != "whole" or req.gpus < 1:
        return None
    for name in sorted(pools):
        p = pools[name]
        if req.gpu_types and p.gpu_type not in req.gpu_types:
            continue
        if spec.backend is not None and spec.backend != p.backend:
            continue
        if req.gpus <= p.gpus_per_node:
            return p
    return None


def _on(run: Run, names: set[str]) -> bool:
    return run.placement is not None and any(s.node in names for s in run.placement.slots)


def _busy(run: Run, names: set[str], now: float) -> Busy:
    """What ``run`` holds on pool nodes, until its start plus ``max_runtime`` (never, without)."""
    assert run.placement is not None
    limit = run.spec.max_runtime_s
    end = (run.started_at or now) + limit if limit is not None else math.inf
    held = tuple((s.node, float(len(s.devices))) for s in run.placement.slots if s.node in names)
    return Busy(held, end)
