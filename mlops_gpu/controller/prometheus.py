"""Prometheus metrics of the cluster, read from the store on each scrape.

``StoreCollector`` is a ``prometheus_client`` custom collector: every ``collect`` builds one
``ClusterView`` (config, inventory, one read of the store) and yields the families below, named
after Kueue's and KAI's so that their queries transfer. ``exposition(rt)`` returns the text
format for a server to mount at ``/metrics``; ``serve`` is ``mlops-gpu metrics --listen``, an
exporter beside the scheduler.

Families (labels):
- ``mlops_gpu_pending_runs{project,priority,reason_code}``, ``mlops_gpu_running_runs{project}``
  (runs holding GPUs: admitted, starting or running)
- ``mlops_gpu_admission_wait_seconds{project,priority}`` histogram: each attempt's wait from
  joining the queue to its admission (ended attempts from the ledger, active ones from runs)
- ``mlops_gpu_admitted_runs_total{project}``, ``mlops_gpu_preempted_runs_total{project,reason}``
  (reason ``preempted`` or ``lost``), ``mlops_gpu_lost_gpu_seconds_total{project}``
- ``mlops_gpu_quota_{nominal,borrowing_limit,used,borrowed}_gpus{project,gpu_type}`` (no
  borrowing-limit series where the limit is unset: no limit)
- ``mlops_gpu_fair_share{project}``, ``mlops_gpu_budget_spent_ratio{project}`` (budgeted only)
- ``mlops_gpu_gpus{node,gpu_type,state}`` (free, allocated, cordoned: every state of every node)
- ``mlops_gpu_gpu_utilization_ratio{node,gpu}``, ``mlops_gpu_gpu_memory_used_bytes{node,gpu}``:
  the last launcher sample of each GPU a running run holds (no series for other GPUs)
- ``mlops_gpu_cost_usd_total{project,gpu_type}``, ``mlops_gpu_idle_gpu_seconds_total{project}``
  (cost: ended attempts plus the running ones so far; idle time is booked when an attempt ends)
- ``mlops_gpu_scheduler_cycle_seconds`` histogram, as the running scheduler last published it

Invariants:
- Bounded cardinality: no label is a run (id, name, user); label values are config names
  (projects, classes, GPU types), node and device names, and fixed codes.
- A scrape never writes to the store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from mlops_gpu.controller.cluster_view import ClusterReader, ClusterView
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.state import observed

P = "mlops_gpu_"
#: ``reason_code`` of a pending run the scheduler has not explained yet
UNEXPLAINED = "unknown"


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
    return CounterMetricFamily(P + name, doc, labels=list(labels))


def _hist_buckets(h: observed.Histogram) -> list[tuple[str, float]]:
    from prometheus_client.utils import floatToGoString

    out = [(floatToGoString(b), float(c)) for b, c in zip(h.bounds, h.buckets, strict=True)]
    return [*out, ("+Inf", float(h.count))]


class StoreCollector(Collector):
    """Reads the store on each scrape (thread-safe: one scrape at a time)."""

    def __init__(self, rt: Runtime) -> None:
        self.reader = ClusterReader(rt)
        self._lock = threading.Lock()
        #: series in the last exposition (the benchmark reports it)
        self.series = 0

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = list(families_of(self.reader.view()))
        self.series = sum(len(f.samples) for f in families)
        yield from families


def families_of(v: ClusterView) -> Iterator[Metric]:
    yield from _queue(v)
    yield from _quota(v)
    yield from _gpus(v)
    yield from _money(v)
    if v.obs.cycles is not None:
        h = HistogramMetricFamily(
            P + "scheduler_cycle_seconds", "Seconds per scheduling cycle (tick)", labels=[]
        )
        h.add_metric([], _hist_buckets(v.obs.cycles), v.obs.cycles.sum)
        yield h


def _projects(v: ClusterView, *more: Any) -> list[str]:
    names = set(v.projects)
    for m in more:
        names.update(k if isinstance(k, str) else k[0] for k in m)
    return sorted(names)


def _queue(v: ClusterView) -> Iterator[Metric]:
    obs = v.obs
    pending = _gauge("pending_runs", "Pending runs by project, class and reason code",
                     ("project", "priority", "reason_code"))  # fmt: skip
    for (project, prio, code), n in sorted(obs.pending.items()):
        pending.add_metric([project, prio, code or UNEXPLAINED], n)
    yield pending
    running = _gauge("running_runs", "Runs holding GPUs (admitted, starting or running)",
                     ("project",))  # fmt: skip
    by = v.running_by_project()
    for p in _projects(v, by):
        running.add_metric([p], by.get(p, 0))
    yield running
    waits: dict[tuple[str, str], observed.Histogram] = {}
    for key, h in obs.ended_waits.items():
        waits[key] = observed.Histogram(h.bounds, list(h.buckets), h.count, h.sum)
    for r in obs.active:
        if r.admitted_at is not None:
            key = (r.project, r.priority)
            h = waits.setdefault(key, observed.Histogram(observed.WAIT_BUCKETS))
            h.observe(max(r.admitted_at - (r.queued_at or r.admitted_at), 0.0))
    wait = HistogramMetricFamily(P + "admission_wait_seconds",
                                 "Seconds from joining the queue to admission, per attempt",
                                 labels=["project", "priority"])  # fmt: skip
    for (p, prio), h in sorted(waits.items()):
        wait.add_metric([p, prio], _hist_buckets(h), h.sum)
    yield wait
    admitted = _counter("admitted_runs_total", "Admissions (attempts admitted)", ("project",))
    for p in _projects(v, obs.admitted):
        admitted.add_metric([p], obs.admitted.get(p, 0))
    yield admitted
    pre = _counter("preempted_runs_total", "Attempts ended by preemption or loss, requeued",
                   ("project", "reason"))  # fmt: skip
    for p in _projects(v, obs.requeued):
        for kind in ("preempted", "lost"):
            pre.add_metric([p, kind], obs.requeued.get((p, kind), 0))
    yield pre
    lost = _counter("lost_gpu_seconds_total",
                    "GPU-seconds of work thrown away by preemptions (since the last checkpoint)",
                    ("project",))  # fmt: skip
    for p in _projects(v, obs.lost_gpu_s):
        lost.add_metric([p], obs.lost_gpu_s.get(p, 0.0))
    yield lost


def _quota(v: ClusterView) -> Iterator[Metric]:
    labels = ("project", "gpu_type")
    nominal = _gauge("quota_nominal_gpus", "Nominal quota (GPUs)", labels)
    limit = _gauge("quota_borrowing_limit_gpus", "Most GPUs borrowed beyond nominal", labels)
    used = _gauge("quota_used_gpus", "GPUs held by the project's active runs", labels)
    borrowed = _gauge("quota_borrowed_gpus", "GPUs held beyond nominal (borrowed)", labels)
    keys = {(p, t) for p in v.projects for t in v.gpu_types} | set(v.used)
    for p, t in sorted(keys):
        q = v.projects[p].quota(t) if p in v.projects else None
        u = v.used.get((p, t), 0.0)
        nom = float(q.nominal) if q is not None else 0.0
        nominal.add_metric([p, t], nom)
        if q is not None and q.borrowing_limit is not None:
            limit.add_metric([p, t], float(q.borrowing_limit))
        used.add_metric([p, t], u)
        borrowed.add_metric([p, t], max(u - nom, 0.0))
    yield from (nominal, limit, used, borrowed)
    share = _gauge("fair_share", "Weighted dominant share (lower goes first)", ("project",))
    for p, s in sorted(v.fair_share.items()):
        share.add_metric([p], s)
    yield share
    budget = _gauge("budget_spent_ratio", "Budget spent in its window (1 = all)", ("project",))
    for p, r in sorted(v.budget_ratio.items()):
        budget.add_metric([p], r)
    yield budget


def _gpus(v: ClusterView) -> Iterator[Metric]:
    gpus = _gauge("gpus", "GPUs by node and state", ("node", "gpu_type", "state"))
    for n in v.nodes:
        counts = {"free": 0, "allocated": 0, "cordoned": 0}
        for d in v.node_devices(n):
            counts[v.gpu_state(n, d)] += 1
        for state, c in counts.items():
            gpus.add_metric([n.name, n.gpu_type, state], c)
    yield gpus
    util = _gauge("gpu_utilization_ratio", "GPU utilization (0..1), last sample", ("node", "gpu"))
    mem = _gauge("gpu_memory_used_bytes", "GPU memory used, last sample", ("node", "gpu"))
    for s in v.obs.samples:
        if s.utilization_pct is not None:
            util.add_metric([s.node, s.device], s.utilization_pct / 100.0)
        if s.memory_used_mb is not None:
            mem.add_metric([s.node, s.device], s.memory_used_mb * 2**20)
    yield util
    yield mem


def _money(v: ClusterView) -> Iterator[Metric]:
    cost = _counter("cost_usd_total", "Cost of GPU time held (USD)", ("project", "gpu_type"))
    keys = set(v.obs.ledger) | set(v.running_gpu_s)
    for p, t in sorted(keys):
        gpu_s = v.obs.ledger.get((p, t), (0.0, 0.0))[0] + v.running_gpu_s.get((p, t), 0.0)
        price = v.gpu_types[t].price_per_hour if t in v.gpu_types else 0.0
        cost.add_metric([p, t], gpu_s / 3600.0 * price)
    yield cost
    idle = _counter("idle_gpu_seconds_total", "GPU-seconds held idle (booked when attempts end)",
                    ("project",))  # fmt: skip
    by: dict[str, float] = {}
    for (p, _t), (_g, i) in v.obs.ledger.items():
        by[p] = by.get(p, 0.0) + i
    for p in _projects(v, by):
        idle.add_metric([p], by.get(p, 0.0))
    yield idle


def registry_for(rt: Runtime) -> tuple[CollectorRegistry, StoreCollector]:
    reg = CollectorRegistry(auto_describe=False)
    col = StoreCollector(rt)
    reg.register(col)
    return reg, col


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """(the text exposition, its content type): what ``/metrics`` answers."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST


def metrics_bytes(rt: Runtime) -> bytes:
    """One exposition for ``rt`` (a fresh collector: for one-off use; a server keeps one
    ``registry_for`` and calls ``exposition`` per request)."""
    return exposition(registry_for(rt)[0])[0]


def serve(rt: Runtime, host: str, port: int, ready: Any = None) -> None:
    """Serve ``/metrics`` over HTTP until interrupted (``ready(server)`` once listening)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    reg, _ = registry_for(rt)

    def app(environ: dict[str, Any], start: Any) -> list[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/metrics/"):
            start("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics\n"]
        body, ctype = exposition(reg)
        start("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None  # a scrape every few seconds would flood the terminal

    with make_server(host, port, app, handler_class=Quiet) as httpd:
        if ready is not None:
            ready(httpd)
        httpd.serve_forever()
