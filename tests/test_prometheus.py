"""A real Prometheus (Debian's ``prometheus``) scrapes a real ``mlops-gpu server``'s ``/metrics``
(with an admin's bearer token from a credentials file, as its docs say to scrape it) while runs
submitted through the server are queued and running on the local backend (a clean HOME, a fake
NVML in the jobs): PromQL through its HTTP API returns what the store holds, every expression
of the Grafana dashboard (``examples/grafana/mlops-gpu.json``) returns data, and ``mlops-gpu
top`` under tmux, locally and against the server (drawn the same), shows the heatmap and the
queue; a viewer's ``top`` names only its project's runs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, _free_port, run_cli
from team.conftest import Server, add_users, start_server, stop_server

from mlops_gpu.config import load_config
from mlops_gpu.model import ACTIVE_PHASES, Phase
from mlops_gpu.state import Store
from mlops_gpu.testing import config_yaml

pytestmark = pytest.mark.slow
HOSTILE = "evil[/bold]\x1b]0;pwned\x07"
DASHBOARD = REPO / "examples" / "grafana" / "mlops-gpu.json"


@dataclass
class Cluster:
    cfg: Path
    env: dict[str, str]
    prom: str
    ids: dict[str, str]
    server: Server | None = None

    def remote(self, who: str = "root") -> dict[str, str]:
        """The environment of a user's laptop: a clean HOME, the server and their token."""
        assert self.server is not None
        (self.cfg.parent / f"laptop-{who}").mkdir(exist_ok=True)
        return {"HOME": str(self.cfg.parent / f"laptop-{who}"), "MLOPS_GPU_URL": self.server.url,
                "MLOPS_GPU_TOKEN": self.server.tokens[who]}  # fmt: skip

    def cli(self, *args: str, who: str = "root") -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=self.remote(who))

    def store(self) -> Store:
        return Store(load_config(self.cfg).store_url)


def _wait_http(url: str, proc: subprocess.Popen[Any], log: Path, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{url} never answered: {log.read_text()[-2000:]}") from None
            time.sleep(0.25)


def promql(base: str, expr: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{base}/api/v1/query?{q}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    out: list[dict[str, Any]] = body["data"]["result"]
    return out


def by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def _submit(c: Cluster, project: str, gpus: int, name: str) -> str:
    r = c.cli("submit", "-p", project, "-g", str(gpus), "-n", name, "--", "sleep", "300")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.time() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    prom_bin = shutil.which("prometheus")
    if prom_bin is None:
        msg = "Debian's prometheus is not installed (apt-get install prometheus)"
        if os.environ.get("MLOPS_GPU_REQUIRE_PROMETHEUS"):
            pytest.fail(msg)
        pytest.skip(msg)
    home = tmp_path_factory.mktemp("home")
    data = yaml.safe_load(config_yaml(nodes=(("node-a", 4), ("node-b", 6)),
                                      projects={"p": (4, 2), "q": (4, 0)}))  # fmt: skip
    data["scheduler"] = {"tick_s": 0.2, "idle_exit_s": 300}
    data["telemetry"] = {"interval_s": 0.5}
    data["mlflow"] = {"enabled": False}
    cfg = home / "mlops-gpu.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = {"HOME": str(home), "MLOPS_GPU_NVML": "mlops_gpu.testing.fake_nvml:from_env",
           "MLOPS_GPU_FAKE_UTIL": "37"}  # fmt: skip
    procs: list[subprocess.Popen[Any]] = []
    prom_port = _free_port()
    prom_log = home / "prometheus.log"
    c = Cluster(cfg, env, f"http://127.0.0.1:{prom_port}", {})
    try:
        tokens = add_users(cfg, {"root": (True, {}), "vic": (False, {"q": "viewer"})})
        c.server = start_server(cfg, env=env)  # (its scheduler beside it: the jobs' fake NVML)
        c.server.tokens = tokens
        (home / "scrape.token").write_text(tokens["root"] + "\n")
        (home / "scrape.token").chmod(0o600)
        target = urllib.parse.urlsplit(c.server.url).netloc
        (home / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "mlops-gpu", "metrics_path": "/metrics",
                "authorization": {"type": "Bearer",
                                  "credentials_file": str(home / "scrape.token")},
                "static_configs": [{"targets": [target]}]}],
        }))  # fmt: skip
        with open(prom_log, "w") as log:
            procs.append(subprocess.Popen(
                [prom_bin, f"--config.file={home / 'prometheus.yml'}",
                 f"--storage.tsdb.path={home / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=log, stderr=subprocess.STDOUT, cwd=home))  # fmt: skip
        _wait_http(f"{c.prom}/-/ready", procs[0], prom_log)
        _until("the first scrape", lambda: promql(c.prom, "up == 1"))
        # wave 1, scraped, then wave 2: admissions while Prometheus watches (rates > 0)
        c.ids["p1"] = _submit(c, "p", 2, "p1")
        c.ids["q1"] = _submit(c, "q", 2, "q1")
        _until("wave 1 scraped", lambda: promql(c.prom, "sum(mlops_gpu_running_runs) == 2"))
        c.ids["p2"] = _submit(c, "p", 2, "p2")
        c.ids["q2"] = _submit(c, "q", 2, "q2")
        c.ids["p3"] = _submit(c, "p", 1, "p3")  # p at nominal, q lends nothing: quota
        c.ids["q3"] = _submit(c, "q", 4, HOSTILE)  # q at nominal, no borrowing: quota

        def settled() -> bool:
            s = c.store()
            try:
                runs = s.list_runs()
                from mlops_gpu.state import observed

                samples = observed.read(s).samples
            finally:
                s.close()
            running = [r for r in runs if r.phase is Phase.RUNNING]
            pending = [r for r in runs if r.phase is Phase.PENDING and r.reason_code]
            return len(running) == 4 and len(pending) == 2 and len(samples) == 8

        _until("4 runs running, 2 explained pending, 8 GPU samples", settled, timeout=90)
        yield c
    finally:
        ids = list(c.ids.values())
        if ids:
            c.cli("cancel", *ids)
            with contextlib.suppress(AssertionError):
                _until("the runs to stop", lambda: not _active(c), timeout=30)
        if c.server is not None:
            stop_server(c.server)
        for p in procs:
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)


def _active(c: Cluster) -> list[Any]:
    s = c.store()
    try:
        return s.list_runs(ACTIVE_PHASES)
    finally:
        s.close()


def _store_figures(c: Cluster) -> tuple[dict[str, float], dict[str, float], int]:
    """(pending by project, GPUs used by project, admissions), from the store."""
    s = c.store()
    try:
        pending: dict[str, float] = defaultdict(float)
        used: dict[str, float] = defaultdict(float)
        for r in s.list_runs():
            if r.phase is Phase.PENDING:
                pending[r.project] += 1
            elif r.phase in ACTIVE_PHASES and r.placement is not None:
                used[r.project] += r.placement.gpu_amount
        admitted = sum(e.kind == "admitted" for e in s.events())
    finally:
        s.close()
    return dict(pending), dict(used), admitted


def test_promql_returns_what_the_store_holds(cluster: Cluster) -> None:
    pending, used, admitted = _store_figures(cluster)
    assert pending == {"p": 1, "q": 1} and used == {"p": 4, "q": 4} and admitted == 4

    def scraped() -> bool:  # the next scrape after the store settled
        got = by_label(promql(cluster.prom, "sum by (project) (mlops_gpu_pending_runs)"),
                       "project")  # fmt: skip
        return got == pending

    _until("Prometheus to hold the settled store", scraped, timeout=30)
    assert by_label(promql(cluster.prom, "sum by (project) (mlops_gpu_quota_used_gpus)"),
                    "project") == used  # fmt: skip
    (total,) = promql(cluster.prom, "sum(mlops_gpu_admitted_runs_total)")
    assert float(total["value"][1]) == admitted

    # A pending run's reason is written by the scheduler's cycle after it is queued (until
    # then its code is ``unknown``): wait for a scrape that has both reasons (failed once in
    # CI when the q run's reason came a scrape later than its count)
    def reasons() -> set[tuple[str, str]]:
        got = promql(cluster.prom, "sum by (project, reason_code) (mlops_gpu_pending_runs)")
        return {(r["metric"]["project"], r["metric"]["reason_code"]) for r in got}

    _until("Prometheus to hold both runs' reasons",
           lambda: reasons() == {("p", "quota"), ("q", "quota")}, timeout=30)  # fmt: skip
    # Each run's launcher samples its GPUs on its own clock and the scheduler writes samples at
    # most every 5 s: the 8 series come within a few scrapes of the store settling, not with it.
    util = _until(
        "a utilization series for each of the 8 held GPUs",
        lambda: (
            (u := promql(cluster.prom, "mlops_gpu_gpu_utilization_ratio")) and len(u) == 8 and u
        ),
        timeout=30,
    )
    assert {float(r["value"][1]) for r in util} == {0.37}
    states = by_label(promql(cluster.prom, "sum by (state) (mlops_gpu_gpus)"), "state")
    assert states == {"allocated": 8, "free": 2}  # (no cordoned series: none is)
    (cycles,) = promql(cluster.prom, "mlops_gpu_scheduler_cycle_seconds_count")
    assert float(cycles["value"][1]) > 0


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for v in node.values():
            yield from _exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _exprs(v)


def test_every_dashboard_expression_returns_data(cluster: Cluster) -> None:
    board = json.loads(DASHBOARD.read_text())
    exprs = list(_exprs(board))
    assert len(exprs) >= 8
    for expr in exprs:
        _until(f"data for {expr!r}", lambda e=expr: promql(cluster.prom, e), timeout=30)


@pytest.mark.parametrize("mode", ["local", "server"])
def test_top_under_tmux_shows_heatmap_and_queue(cluster: Cluster, mode: str) -> None:
    """The same frame locally (the config's store) and against the server (a laptop's clean
    HOME, no config: everything through the API)."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    sock = f"mlops-gpu-test-{os.getpid()}-{mode}"
    if mode == "local":
        env = " ".join(f"{k}={v}" for k, v in cluster.env.items())
        how = f"--config {cluster.cfg} top"
    else:
        laptop = cluster.remote()
        env = " ".join(f"{k}={v}" for k, v in laptop.items())
        how = "top"
    # (no COLUMNS from pytest's environment: top takes the pane's own width)
    cmd = f"env -u COLUMNS -u LINES {env} {sys.executable} -m mlops_gpu.cli.main {how}"
    tmux = ["tmux", "-L", sock]
    subprocess.run([*tmux, "new-session", "-d", "-x", "160", "-y", "50", cmd], check=True)
    try:
        subprocess.run([*tmux, "resize-window", "-x", "160", "-y", "50"], check=True)

        def pane() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True,
                                  check=True).stdout  # fmt: skip

        def framed() -> str:
            text = pane()
            return text if "node-b" in text else ""

        first = _until("top's first frame", framed)
        heat = {ln.split()[0]: sorted(ln.split()[2:]) for ln in first.splitlines()
                if ln.strip().startswith("node-")}  # fmt: skip
        assert heat == {"node-a": ["37"] * 4, "node-b": ["37"] * 4 + ["··"] * 2}, first
        head = [ln for ln in first.splitlines() if cluster.ids["p3"] in ln]
        assert head and "quota" in head[0], first
        assert "\\x1b]0;pwned\\x07" in first, first  # the hostile name, shown as typed
        assert "Queue: 2 pending" in first and "GPUs 10: 8 allocated, 2 free" in first
        stamp = next(ln for ln in first.splitlines() if "mlops-gpu top" in ln)
        _until("a refresh", lambda: stamp not in pane(), timeout=10)  # the clock moves on
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


def test_top_against_the_server_names_only_a_viewers_runs(cluster: Cluster) -> None:
    """``vic`` views project q only: the queue's head, the GPUs' holders and the project rows
    are q's; every GPU is still drawn (as ``/nodes`` shows them to everyone)."""
    r = cluster.cli("top", "--once", "--json", who="vic")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    q_ids = {cluster.ids[k] for k in ("q1", "q2", "q3")}
    assert [x["id"] for x in data["queue"]] == [cluster.ids["q3"]]
    assert data["queue"][0]["reason_code"] == "quota"
    held = [g["run"] for g in data["gpus"] if g["state"] == "allocated"]
    assert len(held) == 8 and {x for x in held if x} <= q_ids and held.count(None) == 4
    assert [p["project"] for p in data["projects"]] == ["q"]
    assert data["pending"] == 1 and data["holding"] == 2
    assert data["counts"] == {"allocated": 8, "free": 2, "cordoned": 0}
    admin = json.loads(cluster.cli("top", "--once", "--json", "--queue", "1").stdout)
    assert len(admin["queue"]) == 1 and admin["pending"] == 2 and admin["holding"] == 4
    denied = run_cli("top", "--once", env={**cluster.remote(), "MLOPS_GPU_TOKEN": "not-a-token"})
    assert denied.returncode == 2 and denied.stderr.startswith("mlops-gpu: error: "), denied
    assert len(denied.stderr.strip().splitlines()) == 1, denied.stderr
