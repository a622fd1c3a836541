"""Prometheus metrics of the cluster, read from the store on each scrape.

``StoreCollector`` is a ``prometheus_client`` custom collector: every ``collect`` builds one
``ClusterView`` (config, inventory, one read of the store) and yields the families below, named
after Kueue's and KAI's so that their queries transfer. A server keeps one collector and answers
``/metrics`` with ``exposition(collector)`` (bytes, content type); ``serve`` is ``mlops-gpu
metrics --listen``, an exporter beside the scheduler.

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
- ``mlops_gpu_gpus{node,gpu_type,state}`` (free and allocated on every node; cordoned where
  there are any)
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

import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
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


class Fam:
    """One metric family as plain rows: what ``collect`` turns into ``prometheus_client``
    families and what ``render`` writes as text directly (building 20,000 ``Sample`` tuples
    per scrape was most of a scrape's time). The same ``add_metric`` calls as
    ``prometheus_client``'s families."""

    __slots__ = ("doc", "labels", "name", "rows", "type")

    def __init__(self, name: str, kind: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.type, self.doc, self.labels = name, kind, doc, tuple(labels)
        self.rows: list[tuple[Any, ...]] = []

    def add_metric(self, values: Sequence[str], value: Any, sum_value: float = 0.0) -> None:
        """A gauge's or counter's (label values, value); a histogram's (label values,
        ``observed.Histogram``)."""
        self.rows.append((tuple(values), value))

    @property
    def series(self) -> int:
        if self.type != "histogram":
            return len(self.rows)
        return sum(len(h.bounds) + 3 for _v, h in self.rows)  # buckets, +Inf, count, sum

    def metric(self) -> Metric:
        if self.type == "histogram":
            m: Any = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
            for values, h in self.rows:
                m.add_metric(list(values), _hist_buckets(h), h.sum)
            return m  # type: ignore[no-any-return]
        cls = CounterMetricFamily if self.type == "counter" else GaugeMetricFamily
        m = cls(self.name, self.doc, labels=list(self.labels))
        for values, value in self.rows:
            m.add_metric(list(values), value)
        return m  # type: ignore[no-any-return]

    def render(self, heads: dict[tuple[str, ...], str] | None = None) -> str:
        """The family's text (as ``text``). ``heads``: label values -> the series' text up to
        its value, kept by the caller between renders (the same nodes, GPUs and projects are
        written every scrape: only the values change)."""
        if heads is None or self.type == "histogram":
            out: list[str] = []
            self.text(out.append)
            return "".join(out)
        name = self.name
        doc = self.doc.replace("\\", "\\\\").replace("\n", "\\n")
        parts = [f"# HELP {name} {doc}\n# TYPE {name} {self.type}\n"]
        keys = [f'{k}="' for k in self.labels]
        if len(heads) > 200_000:  # bounded: nodes and GPUs that left are not written again
            heads.clear()
        get, add = heads.get, parts.append
        for values, value in self.rows:
            head = get(values)
            if head is None:
                inner = ",".join(k + _label(v) + '"' for k, v in zip(keys, values, strict=True))
                head = heads[values] = f"{name}{{{inner}}} " if inner else f"{name} "
            add(head + _num(value) + "\n")
        return "".join(parts)

    def text(self, add: Any) -> None:
        name = self.name
        doc = self.doc.replace("\\", "\\\\").replace("\n", "\\n")
        add(f"# HELP {name} {doc}\n# TYPE {name} {self.type}\n")
        keys = [f'{k}="' for k in self.labels]
        for values, value in self.rows:
            inner = ",".join(k + _label(v) + '"' for k, v in zip(keys, values, strict=True))
            if self.type != "histogram":
                add(f"{name}{{{inner}}} {_num(value)}\n" if inner else f"{name} {_num(value)}\n")
                continue
            sep = "," if inner else ""
            for le, c in _hist_buckets(value):
                add(f'{name}_bucket{{{inner}{sep}le="{le}"}} {_num(c)}\n')
            tail = f"{{{inner}}}" if inner else ""
            add(f"{name}_count{tail} {_num(value.count)}\n{name}_sum{tail} {_num(value.sum)}\n")


def _gauge(name: str, doc: str, labels: Sequence[str]) -> Fam:
    return Fam(P + name, "gauge", doc, labels)


def _counter(name: str, doc: str, labels: Sequence[str]) -> Fam:
    return Fam(P + name, "counter", doc, labels)


def _histogram(name: str, doc: str, labels: Sequence[str]) -> Fam:
    return Fam(P + name, "histogram", doc, labels)


def _hist_buckets(h: observed.Histogram) -> list[tuple[str, float]]:
    from prometheus_client.utils import floatToGoString

    go: Callable[[float], str] = floatToGoString  # (prometheus_client leaves it untyped)
    out = [(go(b), float(c)) for b, c in zip(h.bounds, h.buckets, strict=True)]
    return [*out, ("+Inf", float(h.count))]


class StoreCollector(Collector):
    """Reads the store on each scrape (thread-safe: one scrape at a time)."""

    def __init__(self, rt: Runtime) -> None:
        self.reader = ClusterReader(rt)
        self._lock = threading.Lock()
        #: series in the last exposition (the benchmark reports it)
        self.series = 0
        #: family name -> (its rows, their text) at the last exposition: a family whose rows
        #: did not change (most of them, between two scrapes) is not written again
        self._texts: dict[str, tuple[list[tuple[Any, ...]], str]] = {}
        #: family name -> its series' heads (``Fam.render``)
        self._heads: dict[str, dict[tuple[str, ...], str]] = defaultdict(dict)

    def render(self) -> bytes:
        """The text exposition (``render``), each family's text reused while its rows are
        equal to those it was written from (exact: the text is a function of the rows)."""
        fams = self.families()
        parts = []
        with self._lock:
            texts: dict[str, tuple[list[tuple[Any, ...]], str]] = {}
            for f in fams:
                prev = self._texts.get(f.name)
                if prev is not None and prev[0] == f.rows:
                    text = prev[1]
                else:
                    text = f.render(self._heads[f.name])
                texts[f.name] = (f.rows, text)
                parts.append(text)
            self._texts = texts
        return "".join(parts).encode()

    def families(self) -> list[Fam]:
        with self._lock:
            fams = list(families_of(self.reader.view()))
        self.series = sum(f.series for f in fams)
        return fams

    def collect(self) -> Iterator[Metric]:
        for f in self.families():
            yield f.metric()


def families_of(v: ClusterView) -> Iterator[Fam]:
    yield from _queue(v)
    yield from _quota(v)
    yield from _gpus(v)
    yield from _money(v)
    if v.obs.cycles is not None:
        h = _histogram("scheduler_cycle_seconds", "Seconds per scheduling cycle (tick)", ())
        h.add_metric((), v.obs.cycles)
        yield h


def _projects(v: ClusterView, *more: Any) -> list[str]:
    names = set(v.projects)
    for m in more:
        names.update(k if isinstance(k, str) else k[0] for k in m)
    return sorted(names)


def _queue(v: ClusterView) -> Iterator[Fam]:
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
    for key, vals in v.holding.waits.items():  # (the active attempts' waits)
        waits.setdefault(key, observed.Histogram(observed.WAIT_BUCKETS)).observe_many(vals)
    wait = _histogram("admission_wait_seconds",
                      "Seconds from joining the queue to admission, per attempt",
                      ("project", "priority"))  # fmt: skip
    for (p, prio), h in sorted(waits.items()):
        wait.add_metric((p, prio), h)
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


def _quota(v: ClusterView) -> Iterator[Fam]:
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


def _gpus(v: ClusterView) -> Iterator[Fam]:
    gpus = _gauge("gpus", "GPUs by node and state", ("node", "gpu_type", "state"))
    held = v.held_per_node()
    for n in v.nodes:
        total = n.capacity + sum(len(ids) for ids in n.mig.values())
        taken = held.get(n.name, 0)
        rest = max(total - taken, 0)
        gpus.add_metric((n.name, n.gpu_type, "allocated"), taken)
        gpus.add_metric((n.name, n.gpu_type, "free"), rest if n.schedulable else 0)
        if not n.schedulable and rest:  # (no series per schedulable node: cardinality)
            gpus.add_metric((n.name, n.gpu_type, "cordoned"), rest)
    yield gpus
    util = _gauge("gpu_utilization_ratio", "GPU utilization (0..1), last sample", ("node", "gpu"))
    mem = _gauge("gpu_memory_used_bytes", "GPU memory used, last sample", ("node", "gpu"))
    # (rows written directly: 16,000 ``add_metric`` calls were a fifth of a scrape)
    samples = v.obs.samples
    util.rows = [((s.node, s.device), s.utilization_pct / 100.0)
                 for s in samples if s.utilization_pct is not None]  # fmt: skip
    mem.rows = [((s.node, s.device), s.memory_used_mb * 2**20)
                for s in samples if s.memory_used_mb is not None]  # fmt: skip
    yield util
    yield mem


def _money(v: ClusterView) -> Iterator[Fam]:
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
    """A registry holding one ``StoreCollector`` for ``rt`` (for code that wants
    ``prometheus_client``'s own registry), and that collector."""
    reg = CollectorRegistry(auto_describe=False)
    col = StoreCollector(rt)
    reg.register(col)
    return reg, col


#: The classic text format (version 0.0.4), which every Prometheus reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        v = v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return v


def _num(x: float) -> str:
    f = float(x)
    if f - f == 0.0:  # finite (the fast path: NaN and infinities give NaN)
        return repr(f)
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


def render(families: Iterable[Fam]) -> bytes:
    """The classic text format of ``families``: what ``prometheus_client.generate_latest``
    writes for their ``metric()`` (HELP, TYPE, one line per sample; a counter's name ends in
    ``_total``), written from the rows directly. Label names are fixed identifiers here, so
    only label values are escaped."""
    out: list[str] = []
    for f in families:
        f.text(out.append)
    return "".join(out).encode()


def exposition(source: StoreCollector | CollectorRegistry) -> tuple[bytes, str]:
    """(the text exposition, its content type): what ``/metrics`` answers. A
    ``StoreCollector`` is written directly (fast: ``StoreCollector.render``); a registry
    holding other collectors too goes through ``prometheus_client`` (``generate_latest``)."""
    if isinstance(source, StoreCollector):
        return source.render(), CONTENT_TYPE
    from prometheus_client import generate_latest

    return generate_latest(source), CONTENT_TYPE


def metrics_bytes(rt: Runtime) -> bytes:
    """One exposition for ``rt`` (a fresh collector: for one-off use; a server keeps one
    ``StoreCollector(rt)`` and calls ``exposition(collector)`` per request: the collector
    keeps what it read between scrapes)."""
    return exposition(StoreCollector(rt))[0]


def serve(rt: Runtime, host: str, port: int, ready: Any = None) -> None:
    """Serve ``/metrics`` over HTTP until interrupted (``ready(server)`` once listening)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    col = StoreCollector(rt)

    def app(environ: dict[str, Any], start: Any) -> list[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/metrics/"):
            start("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics\n"]
        try:
            body, ctype = exposition(col)
        except Exception as e:  # a store that cannot be read now: one line; the next scrape
            msg = " ".join(f"cannot read the store: {e}".split())  # tries again
            print(f"mlops-gpu metrics: {msg}", file=sys.stderr, flush=True)
            start("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [msg.encode() + b"\n"]
        start("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None  # a scrape every few seconds would flood the terminal

    with make_server(host, port, app, handler_class=Quiet) as httpd:
        if ready is not None:
            ready(httpd)
        httpd.serve_forever()
