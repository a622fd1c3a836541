"""Prometheus metrics (``controller.prometheus``) and ``mlops-gpu top --once``, read from a store
written through its own API: every family holds the values the store holds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_cli
from prometheus_client.parser import text_string_to_metric_families

from mlops_gpu.backends import JobTelemetry
from mlops_gpu.config import load_config
from mlops_gpu.controller import Runtime
from mlops_gpu.controller.prometheus import metrics_bytes
from mlops_gpu.controller.samples import GpuSamples
from mlops_gpu.model import Phase
from mlops_gpu.state import observed
from mlops_gpu.testing import config_yaml, make_spec
from mlops_gpu.testing.builders import placed

HOSTILE = "evil[/bold]\x1b]0;pwned\x07\u202eX"


def samples_of(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(
    m: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return m[(name, frozenset(labels.items()))]


@pytest.fixture
def rt(tmp_path: Path, store_url: str) -> Runtime:
    """The store on SQLite and on a real PostgreSQL (``store_url``)."""
    data = yaml.safe_load(
        config_yaml(nodes=(("node-a", 4), ("node-b", 2)), projects={"p": (4, 2), "q": (1, None)})
    )
    data["projects"]["q"]["budget"] = {"window_s": 86400, "gpu_hours": 10}
    data["backends"]["local"]["nodes"].append({"name": "node-c", "gpu_type": "a100-80gb",
                                               "gpus": 2})  # fmt: skip
    data["store"] = store_url
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(yaml.safe_dump(data))
    return Runtime(load_config(cfg))


def cordon_c(rt: Runtime) -> None:
    """node-c drained (local nodes never are; Slurm and Kubernetes inventories say so)."""
    nodes = rt.nodes
    rt.nodes = lambda: [  # type: ignore[method-assign]
        replace(n, schedulable=False, state_reason="drained") if n.name == "node-c" else n
        for n in nodes()
    ]


def _fill(rt: Runtime) -> dict[str, str]:
    """p: 2 GPUs running on node-a (queued 100 s), one run preempted (lost 600 GPU-s) and
    pending again; q: 2 GPUs running on node-b (borrowed 1), one pending unexplained; p: one
    pending with a quota reason, and one that ended after an hour on 1 GPU (idle 900 s)."""
    s, t0 = rt.store, 1_000_000.0
    a = s.submit(make_spec("p", 2, name="a"), now=t0)
    b = s.submit(make_spec("q", 2, name="b"), now=t0)
    c = s.submit(make_spec("p", 1, name="c"), now=t0)
    d = s.submit(make_spec("p", 1, name="d"), now=t0)
    e = s.submit(make_spec("q", 1, name=HOSTILE), now=t0)
    f = s.submit(make_spec("p", 4, name="f"), now=t0)
    s.admit(a.id, placed("node-a", ["0", "1"]), now=t0 + 100)
    s.set_handle(a.id, "h-a", Phase.RUNNING, now=t0 + 101)
    s.admit(b.id, placed("node-b", ["0", "1"]), now=t0 + 10)
    s.set_handle(b.id, "h-b", Phase.RUNNING, now=t0 + 11)
    s.admit(c.id, placed("node-a", ["2"]), now=t0 + 5)
    s.mark_preempting(c.id, "reclaimed", now=t0 + 50, lost_gpu_s=600.0)
    s.requeue(c.id, "preempted", "preempted", None, now=t0 + 60)
    s.admit(d.id, placed("node-a", ["3"]), now=t0 + 1)
    s.finish(d.id, Phase.SUCCEEDED, "exited 0", now=t0 + 3601, idle_s=900.0)
    s.set_reasons([(f.id, "quota", "project p is at its nominal", None)])
    return {"a": a.id, "b": b.id, "c": c.id, "e": e.id, "f": f.id}


def test_every_family_holds_the_store_values(rt: Runtime) -> None:
    _fill(rt)
    cordon_c(rt)
    m = samples_of(metrics_bytes(rt).decode())
    # pending by project, class and reason code (c came back preempted; e unexplained)
    assert value(m, "mlops_gpu_pending_runs", project="p", priority="normal",
                 reason_code="quota") == 1  # fmt: skip
    assert value(m, "mlops_gpu_pending_runs", project="p", priority="normal",
                 reason_code="preempted") == 1  # fmt: skip
    assert value(m, "mlops_gpu_pending_runs", project="q", priority="normal",
                 reason_code="unknown") == 1  # fmt: skip
    assert value(m, "mlops_gpu_running_runs", project="p") == 1
    assert value(m, "mlops_gpu_running_runs", project="q") == 1
    # admissions: a, b, c, d (each attempt once)
    assert value(m, "mlops_gpu_admitted_runs_total", project="p") == 3
    assert value(m, "mlops_gpu_admitted_runs_total", project="q") == 1
    assert value(m, "mlops_gpu_preempted_runs_total", project="p", reason="preempted") == 1
    assert value(m, "mlops_gpu_preempted_runs_total", project="q", reason="preempted") == 0
    assert value(m, "mlops_gpu_lost_gpu_seconds_total", project="p") == 600.0
    # quota: nominal, limit (q has none: no series), used, borrowed
    t = "a100-80gb"
    assert value(m, "mlops_gpu_quota_nominal_gpus", project="p", gpu_type=t) == 4
    assert value(m, "mlops_gpu_quota_borrowing_limit_gpus", project="p", gpu_type=t) == 2
    assert ("mlops_gpu_quota_borrowing_limit_gpus",
            frozenset({"project": "q", "gpu_type": t}.items())) not in m  # fmt: skip
    assert value(m, "mlops_gpu_quota_used_gpus", project="p", gpu_type=t) == 2
    assert value(m, "mlops_gpu_quota_used_gpus", project="q", gpu_type=t) == 2
    assert value(m, "mlops_gpu_quota_borrowed_gpus", project="q", gpu_type=t) == 1
    assert value(m, "mlops_gpu_quota_borrowed_gpus", project="p", gpu_type=t) == 0
    # GPUs by node and state: node-c is not schedulable
    g = "mlops_gpu_gpus"
    assert value(m, g, node="node-a", gpu_type=t, state="allocated") == 2
    assert value(m, g, node="node-a", gpu_type=t, state="free") == 2
    assert value(m, g, node="node-b", gpu_type=t, state="allocated") == 2
    assert value(m, g, node="node-c", gpu_type=t, state="cordoned") == 2
    assert value(m, g, node="node-c", gpu_type=t, state="free") == 0
    # admission waits: a waited 100 s, c 5 s, d 1 s (p); b 10 s (q)
    w = "mlops_gpu_admission_wait_seconds"
    assert value(m, w + "_count", project="p", priority="normal") == 3
    assert value(m, w + "_sum", project="p", priority="normal") == pytest.approx(106.0)
    assert value(m, w + "_bucket", project="p", priority="normal", le="5.0") == 2
    assert value(m, w + "_bucket", project="p", priority="normal", le="60.0") == 2
    assert value(m, w + "_bucket", project="p", priority="normal", le="120.0") == 3
    assert value(m, w + "_bucket", project="q", priority="normal", le="+Inf") == 1
    # idle GPU time booked with d's ledger row; cost grows with the running attempts
    assert value(m, "mlops_gpu_idle_gpu_seconds_total", project="p") == 900.0
    assert value(m, "mlops_gpu_cost_usd_total", project="p", gpu_type=t) > 2.5 * (1 + 55 / 3600)
    # fair share and budget are the scheduler's own figures (positive while GPUs are held)
    assert value(m, "mlops_gpu_fair_share", project="p") > 0
    assert value(m, "mlops_gpu_budget_spent_ratio", project="q") > 0
    assert ("mlops_gpu_budget_spent_ratio", frozenset({"project": "p"}.items())) not in m
    # no run id, name or user is a label anywhere (bounded cardinality)
    labels = {v for (_n, ls) in m for (_k, v) in ls}
    assert not labels & {HOSTILE, "a", "tester"} and not any(v.startswith("r") and len(v) == 11
                                                           for v in labels)  # fmt: skip


def test_scheduler_published_figures(rt: Runtime) -> None:
    """Cycle latency and GPU samples come from the scheduler's process, through the store."""
    ids = _fill(rt)
    m = samples_of(metrics_bytes(rt).decode())
    assert not any(n.startswith("mlops_gpu_scheduler_cycle_seconds") for n, _ in m)
    hist = observed.Histogram(observed.CYCLE_BUCKETS)
    for x in (0.003, 0.02, 0.02, 3.0):
        hist.observe(x)
    observed.publish_cycles(rt.store, hist)
    run = rt.store.get(ids["a"])
    assert run is not None
    poll = GpuSamples(rt.store).collect()
    poll.add(run, JobTelemetry(devices=((0, 37.0, 2048.0), (1, 81.0, None)), sampled_at=5.0), 9)
    assert poll.publish() is None
    # a sample left for a run that has ended since (the scheduler stopped): not shown
    ended = observed.GpuSample("node-a", "3", "r-ended", 99.0, 1.0, 5.0)
    observed.publish_samples(rt.store, [*poll.samples.values(), ended])
    m = samples_of(metrics_bytes(rt).decode())
    c = "mlops_gpu_scheduler_cycle_seconds"
    assert value(m, c + "_count") == 4
    assert value(m, c + "_sum") == pytest.approx(3.043)
    assert value(m, c + "_bucket", le="0.005") == 1
    assert value(m, c + "_bucket", le="0.025") == 3
    assert value(m, c + "_bucket", le="+Inf") == 4
    u = "mlops_gpu_gpu_utilization_ratio"
    assert value(m, u, node="node-a", gpu="0") == pytest.approx(0.37)
    assert value(m, u, node="node-a", gpu="1") == pytest.approx(0.81)
    assert value(m, "mlops_gpu_gpu_memory_used_bytes", node="node-a", gpu="0") == 2048 * 2**20
    assert ("mlops_gpu_gpu_utilization_ratio",
            frozenset({"node": "node-a", "gpu": "3"}.items())) not in m  # fmt: skip
    assert ("mlops_gpu_gpu_memory_used_bytes",
            frozenset({"node": "node-a", "gpu": "1"}.items())) not in m  # fmt: skip


def test_render_reads_back_as_prometheus_clients_own_text(rt: Runtime) -> None:
    """The fast text writer and ``generate_latest`` say the same, hostile label values too."""
    from prometheus_client import generate_latest

    from mlops_gpu.controller.prometheus import (
        Fam,
        StoreCollector,
        exposition,
        registry_for,
        render,
    )

    class Fixed:
        def __init__(self, fams: list[Any]) -> None:
            self.fams = fams

        def collect(self) -> list[Any]:
            return self.fams

    _fill(rt)
    col = StoreCollector(rt)
    body, ctype = exposition(col)
    assert ctype.startswith("text/plain; version=0.0.4") and b"mlops_gpu_pending_runs{" in body
    fams = col.families()  # (one read: costs move with the clock)
    theirs = samples_of(generate_latest(Fixed([f.metric() for f in fams])).decode())  # type: ignore[arg-type]
    assert samples_of(render(fams).decode()) == theirs and len(theirs) > 50
    assert col.series == len(theirs)
    # the registry path (prometheus_client's own writer) reads the same families
    reg, _ = registry_for(rt)
    assert {k for k in samples_of(exposition(reg)[0].decode())} == set(theirs)
    odd = Fam("mlops_gpu_x", "gauge", 'doc \\ "q"\nline', ["node"])
    for v in ('a"b', "c\\d", "e\nf", "\u202eg", "", "h}i,j=k"):
        odd.add_metric([v], 1.5)
    mine = samples_of(render([odd]).decode())
    assert mine == samples_of(generate_latest(Fixed([odd.metric()])).decode())  # type: ignore[arg-type]
    assert len(mine) == 6


def test_a_kept_collector_follows_the_store(rt: Runtime) -> None:
    """A server keeps one collector: what changed between scrapes (admissions, ends, new
    ledger rows) shows at the next scrape, as a fresh collector would show it."""
    from mlops_gpu.controller.prometheus import StoreCollector, exposition

    ids = _fill(rt)
    col = StoreCollector(rt)
    m = samples_of(exposition(col)[0].decode())
    t = "a100-80gb"
    assert value(m, "mlops_gpu_quota_used_gpus", project="q", gpu_type=t) == 2
    s = rt.store
    s.finish(ids["b"], Phase.SUCCEEDED, "exited 0", now=1_000_000.0 + 7200, idle_s=30.0)
    s.admit(ids["e"], placed("node-b", ["0"]), now=1_000_000.0 + 7201)
    s.admit(ids["c"], placed("node-a", ["2", "3"][:1]), now=1_000_000.0 + 7202)
    m2 = samples_of(exposition(col)[0].decode())
    fresh = samples_of(metrics_bytes(rt).decode())
    assert value(m2, "mlops_gpu_quota_used_gpus", project="q", gpu_type=t) == 1
    assert value(m2, "mlops_gpu_quota_used_gpus", project="p", gpu_type=t) == 3
    assert value(m2, "mlops_gpu_idle_gpu_seconds_total", project="q") == 60.0
    assert value(m2, "mlops_gpu_admitted_runs_total", project="q") == 2
    assert value(m2, "mlops_gpu_gpus", node="node-b", gpu_type=t, state="allocated") == 1
    for key in ("mlops_gpu_quota_used_gpus", "mlops_gpu_running_runs", "mlops_gpu_gpus",
                "mlops_gpu_pending_runs", "mlops_gpu_fair_share"):  # fmt: skip
        mine = {k: v for k, v in m2.items() if k[0] == key}
        assert mine == pytest.approx({k: v for k, v in fresh.items() if k[0] == key}), key


def test_top_frame_shows_cordoned_gpus_and_sampled_utilization(rt: Runtime) -> None:
    from rich.console import Console

    from mlops_gpu.cli.top import frame
    from mlops_gpu.controller.cluster_view import ClusterReader

    ids = _fill(rt)
    cordon_c(rt)
    run = rt.store.get(ids["a"])
    assert run is not None
    poll = GpuSamples(rt.store).collect()
    poll.add(run, JobTelemetry(devices=((0, 12.4, None), (1, 100.0, None))), 9)
    assert poll.publish() is None
    group, data = frame(rt, ClusterReader(rt), max_nodes=2, queue_rows=1)
    con = Console(width=160, record=True)
    con.print(group)
    text = con.export_text()
    heat = {ln.split()[0]: ln.split()[2:] for ln in text.splitlines()
            if ln.strip().startswith("node-")}  # fmt: skip
    assert heat == {"node-a": ["12", "99", "··", "··"], "node-b": ["██", "██"]}
    assert "1 more nodes" in text  # node-c is past --nodes 2
    assert "GPUs 8: 4 allocated, 2 free, 2 cordoned" in text
    states = {(g["node"], g["gpu"]): g["state"] for g in data["gpus"]}
    assert states[("node-c", "0")] == "cordoned" and states[("node-a", "0")] == "allocated"
    assert len(data["queue"]) == 1 and data["pending"] == 3


def test_samples_are_written_at_most_every_few_seconds_but_ended_runs_leave_at_once(
    rt: Runtime,
) -> None:
    ids = _fill(rt)
    a, b = rt.store.get(ids["a"]), rt.store.get(ids["b"])
    assert a is not None and b is not None
    keep = GpuSamples(rt.store)

    def poll(*runs: tuple[Any, float]) -> None:
        p = keep.collect()
        for run, util in runs:
            p.add(run, JobTelemetry(devices=((0, util, None),)), 1.0)
        assert p.publish() is None

    def stored() -> dict[tuple[str, str], float | None]:
        return {(x.node, x.device): x.utilization_pct for x in observed.read(rt.store).samples}

    poll((a, 10.0), (b, 20.0))
    assert stored() == {("node-a", "0"): 10.0, ("node-b", "0"): 20.0}
    poll((a, 11.0), (b, 21.0))  # new values within PUBLISH_EVERY_S: not written yet
    assert stored() == {("node-a", "0"): 10.0, ("node-b", "0"): 20.0}
    poll((a, 12.0))  # b ended: written at once
    assert stored() == {("node-a", "0"): 12.0}


def test_telemetry_file_devices_round_trip() -> None:
    tel = JobTelemetry.from_dict(
        {
            "mean_utilization": 40,
            "devices": [
                {"position": 0, "utilization_pct": 40, "memory_used_mb": 1024},
                {"position": True, "utilization_pct": 1},  # not a position
                "junk",
                {"position": 1, "utilization_pct": "x"},
            ],
            "sampled_at": 7,
        }
    )
    assert tel.devices == ((0, 40.0, 1024.0), (1, None, None)) and tel.sampled_at == 7.0
    assert JobTelemetry.from_dict({"devices": "nope"}).devices == ()


def test_metrics_once_and_top_once_from_the_cli(rt: Runtime) -> None:
    ids = _fill(rt)
    cfg = str(rt.cfg.source)
    r = run_cli("--config", cfg, "metrics", "--once")
    assert r.returncode == 0, r.stderr
    m = samples_of(r.stdout)
    assert value(m, "mlops_gpu_quota_used_gpus", project="q", gpu_type="a100-80gb") == 2
    r = run_cli("--config", cfg, "metrics")
    assert r.returncode == 2 and "exactly one of --once and --listen" in r.stderr
    r = run_cli("--config", cfg, "metrics", "--listen", "nowhere")
    assert r.returncode == 2 and "expected HOST:PORT" in r.stderr
    r = run_cli("--config", cfg, "top", "--once")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    heat = {ln.split()[0]: ln.split()[2:] for ln in lines if ln.strip().startswith("node-")}
    assert heat == {"node-a": ["██", "██", "··", "··"], "node-b": ["██", "██"],
                    "node-c": ["··", "··"]}  # fmt: skip
    queue = [ln for ln in lines if ids["f"] in ln]
    assert queue and "quota" in queue[0] and "project p is at its nominal" in queue[0]
    assert "GPUs 8: 4 allocated, 4 free, 0 cordoned" in r.stdout
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout
    # the hostile name (pending, so in the queue's head) is shown as typed, escapes visible
    assert "evil[/bold]\\x1b]0;pwned\\x07\\u202eX" in r.stdout
    data = json.loads(run_cli("--config", cfg, "top", "--once", "--json").stdout)
    assert [q["id"] for q in data["queue"]][:1] in ([ids["c"]], [ids["e"]], [ids["f"]])
    assert data["pending"] == 3
    assert sum(g["state"] == "allocated" for g in data["gpus"]) == 4


def test_exporter_serves_metrics_only_and_stops_on_sigterm_mid_scrape(cfg_path: Path) -> None:
    """SIGTERM while scrapes keep coming (wsgiref swallows an exception raised inside one):
    the exporter answers the scrape in progress and exits."""
    import signal
    import subprocess
    import sys
    import threading
    import time
    import urllib.error
    import urllib.request

    from conftest import _free_port

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlops_gpu.cli.main", "--config",
                             str(cfg_path), "metrics", "--listen", f"127.0.0.1:{port}"],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
                    assert b"mlops_gpu_quota_nominal_gpus{" in r.read()
                    break
            except urllib.error.URLError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr
                time.sleep(0.2)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{url}/", timeout=5)
        assert e.value.code == 404
        stop = threading.Event()

        def scrape() -> None:
            while not stop.is_set():
                try:
                    urllib.request.urlopen(f"{url}/metrics", timeout=5).read()
                except OSError:
                    return

        threads = [threading.Thread(target=scrape) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=15) == 0
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_totals_kept_between_scrapes_equal_the_databases_sums(rt: Runtime) -> None:
    """``state.totals``: after admissions, a preemption and ends, the totals brought up to
    date from the rows added equal the database's own sums; a reason-only change reads
    nothing; a ledger row committed late (an id below those already summed) is not missed:
    the database sums all again."""
    from sqlalchemy import func, select

    from mlops_gpu.state import totals
    from mlops_gpu.state.schema import usage

    ids = _fill(rt)
    s, keep = rt.store, totals.Totals()

    def read() -> tuple[totals.TotalsValue, totals.TotalsValue]:
        with s.engine.connect() as conn:
            return keep.read(conn), totals._full(conn)

    first, _ = read()
    s.set_reasons([(ids["e"], "capacity", "no free GPU", None)])
    again, _ = read()
    assert again is first and keep.full_reads == 1
    s.admit(ids["c"], placed("node-c", ["0"]), now=1_000_000.0 + 7000)
    s.mark_preempting(ids["a"], "reclaimed", now=1_000_000.0 + 7100, lost_gpu_s=250.0)
    s.requeue(ids["a"], "preempted", "preempted", None, now=1_000_000.0 + 7110)
    s.finish(ids["b"], Phase.SUCCEEDED, "exited 0", now=1_000_000.0 + 7200, idle_s=30.0)
    kept, full = read()
    assert keep.full_reads == 1  # (only the rows added were read)
    assert kept.admitted == full.admitted == {"p": 4, "q": 1}
    assert kept.requeued == full.requeued and kept.requeued[("p", "preempted")] == 2
    assert kept.lost_gpu_s == pytest.approx(full.lost_gpu_s) and kept.lost_gpu_s["p"] == 850.0
    assert kept.ended_waits == full.ended_waits
    assert kept.ledger == full.ledger
    # a writer that took a lower id commits after the rows above it were summed
    with s.engine.begin() as conn:
        row = conn.execute(select(usage).where(usage.c.run_id == ids["b"])).one()._asdict()
        low = int(conn.execute(select(func.min(usage.c.id))).scalar_one()) - 1
        conn.execute(usage.insert().values({**row, "id": low, "gpu_seconds": 5.0}))
    late, full = read()
    assert keep.full_reads == 2 and late.ledger == full.ledger
    assert late.ledger[("q", "a100-80gb")][0] == pytest.approx(
        kept.ledger[("q", "a100-80gb")][0] + 5
    )
