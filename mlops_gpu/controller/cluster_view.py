"""``ClusterView``: one read of the cluster for the people looking at it: Prometheus metrics
(``controller.prometheus``) and ``mlops-gpu top`` read the same figures from here.

A view is built from the config (projects, quotas, prices, classes), the backends' inventory
(nodes and their devices) and one read of the store (``state.observed``): aggregates, the runs
holding GPUs, the launchers' last GPU samples, the scheduler's cycle histogram.

Invariants:
- Nothing here writes: building a view never changes the store nor wakes the scheduler.
- Its size is bounded by the config and the inventory (projects x GPU types x classes x reason
  codes, nodes x GPUs), plus the runs holding GPUs; never by the pending queue, which is only
  counted (``observed.read``) or cut to its head (``pending_head``).
- A ``ClusterReader`` kept between views (a server's, an exporter's, ``top``'s) reads only what
  changed since its last view (``observed.ActiveFeed``, ``state.totals``) and derives what the
  active runs hold (``Holding``) again only when they changed; what depends on the clock (the
  GPU-seconds of running attempts, fair shares, budgets) is computed at every view.
- GPU samples are shown only for runs still holding GPUs (the scheduler may have stopped since
  it published them).
- A GPU is in exactly one state: ``allocated`` (some active run holds it, wholly, a share or a
  MIG slice of it), else ``cordoned`` (its node is not schedulable), else ``free``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from mlops_gpu.controller import accounting
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.core.fairshare import Shares
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Node
from mlops_gpu.model.cluster import mig_share
from mlops_gpu.state import UsageRow, observed

#: A view re-reads the whole ledger this often (as the controller does: ``loop``).
LEDGER_RELOAD_S = 60.0


@dataclass(frozen=True, slots=True)
class Held:
    """What one active run's stored placement holds (parsed once per placement text)."""

    gpu_type: str
    amount: float
    #: (node, device) of each device held, in the run's device order
    devices: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Holding:
    """What the active runs hold, derived again only when they changed (``ClusterReader``)."""

    #: (node, device) -> the run id holding it (the first of several sharing it)
    holder: dict[tuple[str, str], str]
    #: (project, gpu_type) -> GPU amount held now
    used: dict[tuple[str, str], float]
    #: ((project, gpu_type), GPUs, admitted at) of each admitted run: its GPU-seconds so far
    spans: list[tuple[tuple[str, str], float, float]]
    #: ids of the active runs
    live: frozenset[str]
    #: node -> its GPUs some active run holds (each counted once)
    per_node: dict[str, int]
    #: project -> its active runs
    running: dict[str, int]
    #: (project, class) -> the admission waits of the active attempts (seconds)
    waits: dict[tuple[str, str], list[float]]


_NOTHING = Holding({}, {}, [], frozenset(), {}, {}, {})


@dataclass
class ClusterView:
    now: float
    nodes: list[Node]
    obs: observed.Observed
    #: (node, device) -> the run id holding it (the first of several sharing it)
    holder: dict[tuple[str, str], str]
    #: (project, gpu_type) -> GPU amount held now
    used: dict[tuple[str, str], float]
    #: (project, gpu_type) -> GPU-seconds held so far by the attempts running now
    running_gpu_s: dict[tuple[str, str], float]
    #: project -> weighted dominant share (the order of projects within a class)
    fair_share: dict[str, float]
    #: budgeted project -> the largest of GPU-hours and money spent over its budget
    budget_ratio: dict[str, float]
    projects: dict[str, Any] = field(default_factory=dict)
    gpu_types: dict[str, Any] = field(default_factory=dict)
    priority_classes: dict[str, int] = field(default_factory=dict)
    holding: Holding = _NOTHING

    def gpu_state(self, node: Node, device: str) -> str:
        if (node.name, device) in self.holder:
            return "allocated"
        return "free" if node.schedulable else "cordoned"

    def node_devices(self, node: Node) -> list[str]:
        """Every GPU of the node: whole devices, then the GPUs MIG slices are cut from (as
        their slice ids: a slice held shows the GPU allocated)."""
        out = list(node.devices)
        for ids in node.mig.values():
            out.extend(ids)
        return out

    def held_per_node(self) -> dict[str, int]:
        """node -> its GPUs some active run holds (each counted once)."""
        return self.holding.per_node

    def pending_by_project(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (project, _prio, _code), n in self.obs.pending.items():
            out[project] += n
        return dict(out)

    def running_by_project(self) -> dict[str, int]:
        return self.holding.running


class ClusterReader:
    """Builds views for one runtime; keeps parsed placements between views (a scrape every
    few seconds parses only the placements of runs admitted since the last one)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._held: dict[str, Held] = {}
        # the usage ledger read so far (rows are only added, with growing ids): later views
        # read only newer rows, and decay the fair-share history kept at ``_hist_at``
        self._rows: list[UsageRow] = []
        self._row_id = 0
        self._read_at = float("-inf")
        self._hist: dict[tuple[str, str], float] = {}
        self._hist_at = 0.0
        self._active: list[observed.ActiveRow] = []
        self._feed = observed.ActiveFeed()
        # what the active runs hold, derived at ``_held_rev`` (the feed's generation): a scrape
        # that finds the active runs unchanged derives nothing again
        self._held_rev: int | None = None
        self._holding = _NOTHING
        # the samples of live runs, kept while neither the samples read nor the holding moved
        self._shown: tuple[Any, Holding, list[observed.GpuSample]] = (None, _NOTHING, [])

    def _parse(self, text: str) -> Held:
        h = self._held.get(text)
        if h is None:
            d = json.loads(text)
            slots = d.get("slots", [])
            amount = sum(len(s["devices"]) * float(s.get("fraction", 1.0)) for s in slots)
            devs = tuple((str(s["node"]), str(x)) for s in slots for x in s["devices"])
            if len(self._held) > 200_000:  # bounded: old placements are not needed again
                self._held.clear()
            h = self._held[text] = Held(str(d["gpu_type"]), amount, devs)
        return h

    def view(self, now: float | None = None, with_shares: bool = True) -> ClusterView:
        rt, now = self.rt, time.time() if now is None else now
        cfg = rt.cfg
        nodes = rt.nodes()
        obs = observed.read(rt.store, self._feed)
        self._active = obs.active
        if self._held_rev != self._feed.generation:
            self._holding = self._derive(obs.active)
            self._held_rev = self._feed.generation
        held = self._holding
        running_s: dict[tuple[str, str], float] = defaultdict(float)
        for key, amount, at in held.spans:  # (the clock moves: summed again every view)
            running_s[key] += amount * max(now - at, 0.0)
        # a sample left by a scheduler that stopped, of a run that has ended since: not shown
        raw, was, shown = self._shown
        if raw is not obs.samples or was is not held:
            live = held.live
            shown = [x for x in obs.samples if x.run_id in live]
            self._shown = (obs.samples, held, shown)
        obs.samples = shown
        holder, used = held.holder, held.used
        projects = cfg.model_projects()
        gpu_types = cfg.model_gpu_types()
        shares: dict[str, float] = {}
        ratio: dict[str, float] = {}
        if with_shares:
            shares, ratio = self._shares(nodes, used, now)
        return ClusterView(now, nodes, obs, holder, dict(used), dict(running_s), shares, ratio,
                           projects, gpu_types, dict(cfg.priority_classes), held)  # fmt: skip

    def _derive(self, active: list[observed.ActiveRow]) -> Holding:
        """What ``active`` holds (``Holding``)."""
        holder: dict[tuple[str, str], str] = {}
        used: dict[tuple[str, str], float] = defaultdict(float)
        spans: list[tuple[tuple[str, str], float, float]] = []
        running: dict[str, int] = defaultdict(int)
        waits: dict[tuple[str, str], list[float]] = defaultdict(list)
        for r in active:
            running[r.project] += 1
            if r.admitted_at is not None:
                waits[(r.project, r.priority)].append(
                    max(r.admitted_at - (r.queued_at or r.admitted_at), 0.0)
                )
            if not r.placement:
                continue
            h = self._parse(r.placement)
            used[(r.project, h.gpu_type)] += h.amount
            if r.admitted_at is not None:
                spans.append(((r.project, h.gpu_type), h.amount, r.admitted_at))
            for key in h.devices:
                holder.setdefault(key, r.id)
        per_node: dict[str, int] = defaultdict(int)
        for node, _dev in holder:
            per_node[node] += 1
        live = frozenset(r.id for r in active)
        return Holding(holder, dict(used), spans, live, dict(per_node), dict(running), dict(waits))

    def _shares(
        self, nodes: list[Node], used: dict[tuple[str, str], float], now: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """(fair share of every configured project, budget spent ratio of budgeted ones), as
        the scheduler computes them from the usage ledger."""
        cfg = self.rt.cfg
        projects, prices = cfg.model_projects(), cfg.model_gpu_types()
        policy = cfg.policy_settings()
        since = accounting.ledger_since(now, policy.half_life_s, projects)
        rows, history = self._ledger(since, now, policy.half_life_s)
        capacity: dict[str, float] = defaultdict(float)
        for n in nodes:
            # (as ``Capacity.capacity_by_type``: a MIG slice counts its share of a GPU)
            capacity[n.gpu_type] += n.capacity + sum(
                len(v) * mig_share(p) for p, v in n.mig.items()
            )
        snap = Snapshot(now=now, nodes=(), pending=(), active=(), projects=projects,
                        gpu_types=prices, priority_classes=dict(cfg.priority_classes),
                        cohorts={}, policy=policy, usage_history=history)  # fmt: skip
        book = Shares(snap, used, capacity)
        shares = {p: book.share(p) for p in projects}
        ratio: dict[str, float] = {}
        windows = {p.name: p.budget for p in projects.values() if p.budget is not None}
        if windows:
            spent = self._spent(rows, now, projects, prices)
            for name, b in windows.items():
                hours, usd = spent.get(name, (0.0, 0.0))
                parts = []
                if b.gpu_hours:
                    parts.append(hours / b.gpu_hours)
                if b.usd:
                    parts.append(usd / b.usd)
                ratio[name] = max(parts, default=0.0)
        return shares, ratio

    def _ledger(
        self, since: float, now: float, half_life: float
    ) -> tuple[list[UsageRow], dict[tuple[str, str], float]]:
        """(ledger rows ending at or after ``since``, decayed usage history at ``now``).
        Full re-read every ``LEDGER_RELOAD_S`` (ids from concurrent writers may commit out of
        order, as the controller knows); in between only rows with newer ids, and the history
        kept is decayed to ``now`` (a finished interval's weight only shrinks, by
        2^(-dt / half_life)) before the new rows are added."""
        store = self.rt.store
        if now - self._read_at >= LEDGER_RELOAD_S or now < self._hist_at:
            self._rows = store.usage(since=since)
            self._hist = accounting.usage_history(self._rows, now, half_life)
            self._read_at = now
            self._row_id = max((r.id for r in self._rows), default=self._row_id)
        else:
            new = store.usage(after_id=self._row_id)
            f = 2.0 ** (-(now - self._hist_at) / half_life)
            hist = {k: v * f for k, v in self._hist.items()}
            for k, v in accounting.usage_history(new, now, half_life).items():
                hist[k] = hist.get(k, 0.0) + v
            self._hist = hist
            self._rows.extend(new)
            # (the newest id read: rows dropped below for their age are not read again)
            self._row_id = max((r.id for r in new), default=self._row_id)
            if self._rows and self._rows[0].end < since:
                self._rows = [r for r in self._rows if r.end >= since]
        self._hist_at = now
        return self._rows, self._hist

    def _spent(
        self, rows: list[UsageRow], now: float, projects: dict[str, Any], prices: dict[str, Any]
    ) -> dict[str, tuple[float, float]]:
        """What budgeted projects spent in their windows, running attempts included (as the
        scheduler counts it: ``accounting.spent``)."""
        spent = accounting.spent(rows, [], now, projects, prices)
        windows = {p.name: p.budget.window_s for p in projects.values() if p.budget is not None}
        for r in self._active:
            w = windows.get(r.project)
            if w is None or not r.placement or r.admitted_at is None:
                continue
            h = self._parse(r.placement)
            hours = h.amount * max(now - max(r.admitted_at, now - w), 0.0) / 3600
            price = prices[h.gpu_type].price_per_hour if h.gpu_type in prices else 0.0
            old = spent.get(r.project, (0.0, 0.0))
            spent[r.project] = (old[0] + hours, old[1] + hours * price)
        return spent
