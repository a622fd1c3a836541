"""The Cluster page: a heatmap of every GPU, one cell per GPU (and per MIG slice), coloured by
the utilization its holder's launcher last sampled, with who holds it on hover.

The figures come from one ``ClusterView`` (``controller.cluster_view``: what ``/metrics`` and
``top`` read), kept per server (``Views``): a refresh parses only the placements of runs
admitted since the last one.

Invariants: every GPU of the inventory is exactly one cell; a cell names a run (id, name,
project, user) only when the identity may see that run's project ("another project" else);
a shared GPU lists each of its holders with their share; a MIG slice shows its profile.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

from mlops_gpu.controller.cluster_view import ClusterReader, ClusterView, Holding
from mlops_gpu.server.auth import Identity

Sums = tuple[
    dict[tuple[str, str], float],  # (project, GPU type) -> GPUs held
    # (project, GPU type) -> (GPUs of admitted runs, the sum of their GPUs x admitted_at)
    dict[tuple[str, str], tuple[float, float]],
    dict[tuple[str, str], str],  # (node, device) -> the first run holding it
    dict[str, int],  # project -> its active runs (the Projects and Costs pages count them)
]


def _held_sums(reader: ClusterReader, active: list[Any]) -> Sums:
    used: dict[tuple[str, str], float] = defaultdict(float)
    amount_at: dict[tuple[str, str], tuple[float, float]] = {}
    holder: dict[tuple[str, str], str] = {}
    running: dict[str, int] = defaultdict(int)
    for r in active:
        running[r.project] += 1
        if not r.placement:
            continue
        h = reader._parse(r.placement)
        used[(r.project, h.gpu_type)] += h.amount
        if r.admitted_at is not None:
            a, at = amount_at.get((r.project, h.gpu_type), (0.0, 0.0))
            amount_at[(r.project, h.gpu_type)] = (a + h.amount, at + h.amount * r.admitted_at)
        for key in h.devices:
            holder.setdefault(key, r.id)
    return dict(used), amount_at, holder, dict(running)


class DashReader(ClusterReader):
    """A ``ClusterReader`` whose views read only what the pages show (``dashboard_reads.live``:
    the runs holding GPUs, the GPU samples, and for Projects the pending counts), not the
    ledger and event aggregates the metrics add (most of a view's time on a big store). Fair
    shares and budgets come from the reader's own ledger cache, as in the metrics."""

    def __init__(self, rt: Any) -> None:
        super().__init__(rt)
        self._held_at: int | None = -1  # the feed's revision ``_sums`` was counted at
        self._sums: Sums = ({}, {}, {}, {})

    def light(self, with_shares: bool) -> ClusterView:
        from mlops_gpu.state.dashboard_reads import live

        rt, now = self.rt, time.time()
        nodes = rt.nodes()
        obs = live(rt.store, self._feed, with_pending=with_shares)
        self._active = obs.active
        if self._held_at != self._feed.rev:  # the runs holding GPUs changed since: recount
            self._held_at = self._feed.rev
            self._sums = _held_sums(self, obs.active)
        used, amount_at, holder, running = self._sums
        # GPU-seconds held so far: sum(amount * (now - admitted_at)) per project and type
        running_s = {k: max(a * now - at, 0.0) for k, (a, at) in amount_at.items()}
        live_ids = {r.id for r in obs.active}  # (a sample of a run ended since: not shown)
        obs.samples = [x for x in obs.samples if x.run_id in live_ids]
        shares: dict[str, float] = {}
        ratio: dict[str, float] = {}
        if with_shares:
            shares, ratio = self._shares(nodes, used, now)
        cfg = rt.cfg
        # what the pages read of the holding: the active runs per project (``per_node``,
        # ``spans`` and ``waits`` are the metrics' and ``top``'s, not read here)
        holding = Holding(holder, dict(used), [], frozenset(live_ids), {}, running, {})
        return ClusterView(now, nodes, obs, holder, dict(used), running_s, shares, ratio,
                           cfg.model_projects(), cfg.model_gpu_types(),
                           dict(cfg.priority_classes), holding)  # fmt: skip


class Views:
    """One ``DashReader`` per server, read by one request at a time (it caches)."""

    def __init__(self, rt: Any) -> None:
        self.reader = DashReader(rt)
        self.lock = threading.Lock()
        #: placement text -> ((node, device, share), ...)
        self._slots: dict[str, tuple[tuple[str, str, float], ...]] = {}

    def view(self, with_shares: bool) -> ClusterView:
        with self.lock:
            return self.reader.light(with_shares)

    def slots(self, text: str) -> tuple[tuple[str, str, float], ...]:
        got = self._slots.get(text)
        if got is None:
            d = json.loads(text)
            got = tuple((str(s["node"]), str(x), float(s.get("fraction", 1.0)))
                        for s in d.get("slots", []) for x in s["devices"])  # fmt: skip
            if len(self._slots) > 200_000:  # bounded: old placements are not needed again
                self._slots.clear()
            self._slots[text] = got
        return got


def views_of(app: Any) -> Views:
    with _made:
        v: Views | None = getattr(app.state, "dash_views", None)
        if v is None:
            v = app.state.dash_views = Views(app.state.rt)
    return v


_made = threading.Lock()


@dataclass
class Heatmap:
    #: the heatmap's HTML: a box per node, a cell per GPU (see ``build``)
    html: Markup
    gpus: int
    allocated: int
    free: int
    cordoned: int
    mean_util: float | None


_BUCKETS = ("u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8", "u9", "u9")


def build(views: Views, who: Identity) -> Heatmap:
    """The heatmap, written here as HTML (``Markup``): 8,000 cells through a template loop
    took most of the page's time. Every text put in it is escaped once where it is made (a
    run's label, a node's name, a device id); the rest is fixed text and numbers."""
    v = views.view(with_shares=False)
    util = {(s.node, s.device): s.utilization_pct for s in v.obs.samples}
    holders: dict[tuple[str, str], list[str]] = {}
    for r in v.obs.active:
        if not r.placement:
            continue
        if who.can_see(r.project):
            name = f" {r.name}" if r.name else ""
            label = str(escape(f"{r.id}{name} ({r.project}, {r.user})"))
        else:
            label = "a run of another project"
        for node, dev, share in views.slots(r.placement):
            text = label if share >= 1.0 else f"{label} {share:g} GPU"
            holders.setdefault((node, dev), []).append(text)
    out: list[str] = []
    counts = {"allocated": 0, "free": 0, "cordoned": 0}
    esc: dict[str, str] = {}  # device id -> escaped (nodes repeat the same ids)
    for n in v.nodes:
        name = str(escape(n.name))
        free = "free" if n.schedulable else "cordoned"
        about = " · ".join(x for x in (name, str(escape(n.gpu_type)), "shared" if n.shared
                                       else "", str(escape(n.state_reason))) if x)  # fmt: skip
        out.append(f'<div class="node{"" if n.schedulable else " down"}" title="{about}">'
                   f'<span class="nn">{name}</span>')  # fmt: skip
        devices = [(d, "") for d in n.devices]
        devices += [(d, prof) for prof, ids in n.mig.items() for d in ids]
        for dev, prof in devices:
            key = (n.name, dev)
            held = holders.get(key)
            state = "allocated" if held else free
            counts[state] += 1
            u = util.get(key)
            d = esc.get(dev)
            if d is None:
                d = esc[dev] = str(escape(dev))
            title = f"{name} GPU {d} MIG {escape(prof)} · {state}" if prof else \
                f"{name} GPU {d} · {state}"  # fmt: skip
            if u is not None:
                title += f" · {u:.0f}% busy"
            if held:
                title += " · " + "; ".join(held)
            if prof:
                kind, mark = "mig", "M"
            elif n.shared or (held and len(held) > 1):
                kind, mark = "shared", "S"
            else:
                kind, mark = "gpu", ""
            bucket = "un" if u is None else _BUCKETS[min(max(int(u // 10), 0), 10)]
            out.append(f'<span class="g {kind} {state} {bucket}" title="{title}">{mark}</span>')
        out.append("</div>\n")
    sampled = [u for u in util.values() if u is not None]
    mean = sum(sampled) / len(sampled) if sampled else None
    total = sum(counts.values())
    return Heatmap(Markup("".join(out)), total, counts["allocated"], counts["free"],
                   counts["cordoned"], mean)  # fmt: skip
