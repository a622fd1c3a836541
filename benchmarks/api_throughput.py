"""``mlops-gpu server`` under load (issue 26): submits over HTTP against submits straight into the
store, listing 50,000 pending runs page by page, and the fail-over of two servers.

1. Submits: a server (``--no-scheduler``: the runs stay pending, so only the API is measured)
   on PostgreSQL; ``--clients`` concurrent clients, each with its own token and its own
   keep-alive connection, each submitting one run per request (``POST /api/v1/runs``) as fast as
   answers come back. The clients run in ``--load-procs`` processes of their own (raw asyncio
   HTTP/1.1, so the load generator takes little of the CPU the server needs). Baseline in the
   same run: the same number of single-run submits straight into the store (``Runtime.submit``,
   one process, one after another: what the CLI does per run).
2. Listing: ``--pending`` pending runs in the store, listed page by page (``GET /api/v1/runs
   ?phase=pending&limit=--page``, following ``next_cursor``); the latency of each page.
3. Fail-over: two servers with their schedulers on one fresh PostgreSQL store (local backend,
   ``true`` runs); while runs are submitted through both, the leader is SIGKILLed; the gap is
   from the kill until the standby admits a run (the first ``admitted`` event after the kill).

Targets (2 cores): ``api_submits_per_s`` >= 500 with ``submit_p99_ms`` <= 100, ``list_p99_ms``
<= 100 for a page of 500 with 50,000 pending, ``failover_s`` <= 15.

The machine may be shared: the table also gives the CPU per request of the server and of the
PostgreSQL backends serving it (from /proc: PostgreSQL must run on this machine) and the load
average, which the wall-clock figures depend on.

    MLOPS_GPU_TEST_PG_URL=postgresql+psycopg://... python benchmarks/api_throughput.py

Prints a short table, then one JSON line (last) with ``clients``, ``runs``,
``api_submits_per_s``, ``direct_submits_per_s``, ``submit_p50_ms``, ``submit_p99_ms``,
``list_p99_ms``, ``failover_s`` and the set-up. The store's tables are dropped first: give it a
database of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
TABLES = ("runs", "events", "usage", "schema_version", "leader", "scheduler_status",
          "scheduler_cycles", "gpu_samples", "mlflow_runs", "users", "tokens", "memberships",
          "audit", "revision")  # fmt: skip
BODY = {"command": ["true"], "project": "p", "name": "bench"}


# -- the load generator (its own processes) ---------------------------------------------------


async def _client(port: int, token: str, n: int, warm: int, out: list[float]) -> None:
    """One keep-alive connection submitting ``warm`` + ``n`` runs one after another; the
    latencies (seconds) of the last ``n`` appended to ``out``."""
    body = json.dumps(BODY).encode()
    head = (
        f"POST /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(warm + n):
            t0 = time.perf_counter()
            writer.write(head + body)
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            data = await reader.readexactly(length)
            status = int(status_line.split()[1])
            if status != 201:
                raise RuntimeError(f"submit answered {status}: {data[:300]!r}")
            if i >= warm:
                out.append(time.perf_counter() - t0)
    finally:
        writer.close()


async def _load(port: int, tokens: list[str], per_client: int, warm: int) -> dict[str, Any]:
    lat: list[float] = []
    # every client warms up (connection, first requests) before the clock starts
    await asyncio.gather(*(_client(port, t, 0, warm, lat) for t in tokens))
    t0 = time.perf_counter()
    await asyncio.gather(*(_client(port, t, per_client, 0, lat) for t in tokens))
    return {"lat": lat, "start": t0, "end": time.perf_counter()}


def load_main(args: list[str]) -> None:
    spec = json.loads(args[0])
    res = asyncio.run(_load(spec["port"], spec["tokens"], spec["per_client"], spec["warm"]))
    # the wall clock is per process: the parent reads the span, not the absolute times
    print(json.dumps({"lat": res["lat"], "span": res["end"] - res["start"]}))


# -- set-up -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def drop_tables(url: str) -> None:
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.begin() as conn:
        for t in TABLES:
            conn.execute(text(f"DROP TABLE IF EXISTS {t} CASCADE"))
    eng.dispose()


def write_config(d: Path, url: str, nodes: int = 4) -> Path:
    cfg = {
        "store": url,
        "state_dir": str(d / "state"),
        "gpu_types": {"a100-80gb": {"price_per_hour": 2.5}},
        "backends": {"local": {"type": "local", "nodes": [
            {"name": f"node-{i}", "gpu_type": "a100-80gb", "gpus": 4} for i in range(nodes)]}},
        "cohorts": {"org": {}},
        "projects": {"p": {"cohort": "org",
                           "quotas": {"a100-80gb": {"nominal": 4 * nodes, "borrowing_limit": 0}}}},
        "scheduler": {"tick_s": 0.2},
        "mlflow": {"enabled": False},
        "telemetry": {"launcher": False},
        "server": {"rate_per_s": None},
    }  # fmt: skip
    path = d / "mlops-gpu.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def make_users(cfg: Path, n: int) -> list[str]:
    from mlops_gpu.config import load_config
    from mlops_gpu.state import Store
    from mlops_gpu.state.users import add_user

    store = Store(load_config(cfg).store_url)
    try:
        toks = [add_user(store, f"c{i:02d}", admin=False, projects={"p": "member"}, ttl_s=86400)
                for i in range(n)]  # fmt: skip
        toks.append(add_user(store, "root", admin=True, projects={}, ttl_s=86400))
        return toks
    finally:
        store.close()


def start_server(cfg: Path, log: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    import urllib.request

    port = _free_port()
    out = open(log, "ab")  # noqa: SIM115 - the process holds it
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(cfg), "server",
         "--port", str(port), *args], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2):
                return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and their children that were waited for
    (/proc; the server's worker processes are its children)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15]) / tick
    return total


class PgCpu:
    """CPU seconds of the PostgreSQL backends serving ``url``'s database (the server's pool;
    /proc, so PostgreSQL must run on this machine): read at ``start`` and at ``seconds``. A
    backend that started in between counts from 0; one that ended in between is missed."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        self.eng = create_engine(url, poolclass=NullPool)
        self.at0: dict[int, float] = {}
        self.sessions0 = 0

    def _pids(self) -> list[int]:
        from sqlalchemy import text

        with self.eng.connect() as conn:
            q = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                 "AND pid <> pg_backend_pid()")  # fmt: skip
            return [int(p) for (p,) in conn.execute(text(q))]

    def _sessions(self) -> int:
        from sqlalchemy import text

        with self.eng.connect() as conn:
            q = "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
            return int(conn.execute(text(q)).scalar_one())

    def start(self) -> None:
        self.at0 = {p: cpu_s([p]) for p in self._pids()}
        self.sessions0 = self._sessions()

    def seconds(self) -> float:
        return sum(cpu_s([p]) - self.at0.get(p, 0.0) for p in self._pids())

    def sessions(self) -> int:
        """Connections opened since ``start`` (a pool that closes and reopens them costs
        PostgreSQL a backend process each; their CPU is missed by ``seconds``), less the
        readings' own."""
        return self._sessions() - self.sessions0 - 2


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        todo += [int(k) for k in kids]
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


# -- the phases -------------------------------------------------------------------------------


def bench_submits(port: int, server_pid: int, tokens: list[str], runs: int,
                  procs: int, warm: int, pg: PgCpu) -> dict[str, Any]:  # fmt: skip
    clients = len(tokens)
    per_client = runs // clients
    groups = [tokens[i::procs] for i in range(procs)]
    import resource

    pids = tree(server_pid)
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    pg.start()
    cpu0, t0 = cpu_s(pids), time.perf_counter()
    loaders = []
    for g in groups:
        job = json.dumps({"port": port, "tokens": g, "per_client": per_client, "warm": warm})
        cmd = [sys.executable, __file__, "--load-worker", job]
        loaders.append(subprocess.Popen(cmd, stdout=subprocess.PIPE))
    lat: list[float] = []
    spans = []
    for p in loaders:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError("a load process failed")
        res = json.loads(out.decode().strip().splitlines()[-1])
        lat += res["lat"]
        spans.append(res["span"])
    wall = time.perf_counter() - t0
    cpu = cpu_s(pids) - cpu0
    pg_cpu, pg_sessions = pg.seconds(), pg.sessions()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = kids.ru_utime + kids.ru_stime - kids0.ru_utime - kids0.ru_stime
    done = per_client * clients
    span = max(spans)
    return {
        "runs": done,
        "api_submits_per_s": done / span,
        "submit_p50_ms": pct(lat, 0.50) * 1000,
        "submit_p99_ms": pct(lat, 0.99) * 1000,
        "server_cpu_ms_per_submit": cpu * 1000 / (done + warm * clients),
        "server_cpu_s": cpu,
        "pg_cpu_ms_per_submit": pg_cpu * 1000 / (done + warm * clients),
        "pg_sessions_submits": pg_sessions,
        "client_cpu_ms_per_submit": client_cpu * 1000 / (done + warm * clients),
        "load_wall_s": wall,
    }


def bench_direct(cfg: Path, n: int) -> float:
    from mlops_gpu.config import load_config
    from mlops_gpu.controller import Runtime

    rt = Runtime(load_config(cfg))
    try:
        spec = rt.spec(("true",), project="p", name="bench", user="direct")
        rt.submit(spec)  # warm: store open, backends built
        t0 = time.perf_counter()
        for _ in range(n):
            rt.submit(spec)
        return n / (time.perf_counter() - t0)
    finally:
        rt.close()


def fill_pending(cfg: Path, target: int) -> int:
    from mlops_gpu.config import load_config
    from mlops_gpu.state import Store
    from mlops_gpu.testing import make_spec

    store = Store(load_config(cfg).store_url)
    try:
        have = store.count()
        spec = make_spec("p", 1, name="bench")
        while have < target:
            k = min(5000, target - have)
            store.submit_many([spec] * k)
            have += k
        return have
    finally:
        store.close()


def bench_list(port: int, server_pid: int, token: str, page: int, pg: PgCpu) -> dict[str, Any]:
    import httpx

    lat: list[float] = []
    seen = 0
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                      headers={"Authorization": f"Bearer {token}"}) as c:  # fmt: skip
        c.get("/api/v1/runs", params={"phase": "pending", "limit": page})  # warm
        pids = tree(server_pid)
        pg.start()
        cpu0 = cpu_s(pids)
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"phase": "pending", "limit": page}
            if cursor is not None:
                params["cursor"] = cursor
            t0 = time.perf_counter()
            r = c.get("/api/v1/runs", params=params)
            lat.append(time.perf_counter() - t0)
            r.raise_for_status()
            body = r.json()
            seen += len(body["runs"])
            cursor = body["next_cursor"]
            if cursor is None:
                break
        cpu = cpu_s(pids) - cpu0
        pg_cpu, pg_sessions = pg.seconds(), pg.sessions()
    return {"pages": len(lat), "listed": seen, "list_p50_ms": pct(lat, 0.5) * 1000,
            "list_p99_ms": pct(lat, 0.99) * 1000,
            "server_cpu_ms_per_page": cpu * 1000 / max(1, len(lat)),
            "pg_cpu_ms_per_page": pg_cpu * 1000 / max(1, len(lat)),
            "pg_sessions_list": pg_sessions}  # fmt: skip


def bench_failover(d: Path, url: str, runs: int) -> dict[str, Any]:
    """Two servers with schedulers; SIGKILL the leader half-way through ``runs`` submits."""
    import httpx
    from sqlalchemy import func, select

    from mlops_gpu.config import load_config
    from mlops_gpu.state import Store
    from mlops_gpu.state.schema import events

    drop_tables(url)
    fd = d / "failover"
    fd.mkdir()
    cfg = write_config(fd, url)
    tokens = make_users(cfg, 1)
    a, pa = start_server(cfg, fd / "a.log")
    b, pb = start_server(cfg, fd / "b.log")
    procs = {pa: a, pb: b}
    store = Store(load_config(cfg).store_url)
    try:
        hdr = {"Authorization": f"Bearer {tokens[0]}"}
        clients = {p: httpx.Client(base_url=f"http://127.0.0.1:{p}", headers=hdr, timeout=30)
                   for p in procs}  # fmt: skip

        def role(p: int) -> str:
            return str(clients[p].get("/api/v1/scheduler").json()["this_server"])

        deadline = time.monotonic() + 60
        while "leader" not in (role(pa), role(pb)):
            if time.monotonic() > deadline:
                raise RuntimeError("no server leads")
            time.sleep(0.2)
        leader = pa if role(pa) == "leader" else pb
        other = pb if leader == pa else pa
        killed_at = 0.0
        for i in range(runs):
            if i == runs // 2:
                procs[leader].send_signal(signal.SIGKILL)
                procs[leader].wait()
                killed_at = time.time()
            # alternate between the servers while both live, then the survivor only
            port = other if killed_at or i % 2 else leader
            r = clients[port].post("/api/v1/runs", json=BODY)
            if r.status_code != 201:
                raise RuntimeError(f"submit answered {r.status_code}: {r.text[:300]}")
        deadline = time.monotonic() + 120
        first = None
        while first is None and time.monotonic() < deadline:
            with store.engine.connect() as conn:
                first = conn.execute(
                    select(func.min(events.c.time)).where(
                        events.c.kind == "admitted", events.c.time > killed_at
                    )
                ).scalar()
            time.sleep(0.2)
        if first is None:
            raise RuntimeError("the standby admitted nothing after the kill")
        return {"failover_s": float(first) - killed_at, "failover_runs": runs}
    finally:
        for c in clients.values():
            c.close()
        store.close()
        for p in procs.values():
            stop(p)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--load-worker":
        load_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=os.environ.get("MLOPS_GPU_TEST_PG_URL"),
                    help="PostgreSQL URL (default: $MLOPS_GPU_TEST_PG_URL); its tables are "
                    "dropped")  # fmt: skip
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--runs", type=int, default=8000, help="submits over HTTP (and directly)")
    ap.add_argument("--warm", type=int, default=5, help="submits per client before the clock")
    ap.add_argument("--load-procs", type=int, default=2, help="load generator processes")
    ap.add_argument("--pending", type=int, default=50_000)
    ap.add_argument("--page", type=int, default=500)
    ap.add_argument("--failover-runs", type=int, default=200)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra argument for `mlops-gpu server` (repeatable)")  # fmt: skip
    ap.add_argument("--skip", action="append", default=[],
                    choices=["direct", "list", "failover"])  # fmt: skip
    args = ap.parse_args()
    if not args.store or not args.store.startswith("postgresql"):
        sys.exit("api_throughput.py: give a PostgreSQL URL (--store or MLOPS_GPU_TEST_PG_URL)")
    load0 = os.getloadavg()[0]
    res: dict[str, Any] = {"clients": args.clients}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        drop_tables(args.store)
        cfg = write_config(d, args.store)
        tokens = make_users(cfg, args.clients)
        proc, port = start_server(cfg, d / "server.log", "--no-scheduler", *args.server_arg)
        pg = PgCpu(args.store)
        try:
            res.update(bench_submits(port, proc.pid, tokens[:-1], args.runs,
                                     args.load_procs, args.warm, pg))  # fmt: skip
            res["direct_submits_per_s"] = (
                None if "direct" in args.skip else bench_direct(cfg, res["runs"])
            )
            if "list" not in args.skip:
                res["pending"] = fill_pending(cfg, args.pending)
                res["page"] = args.page
                res.update(bench_list(port, proc.pid, tokens[-1], args.page, pg))
            else:
                res["list_p99_ms"] = None
        except Exception:
            print((d / "server.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            pg.eng.dispose()
            stop(proc)
        if "failover" not in args.skip:
            res.update(bench_failover(d, args.store, args.failover_runs))
        else:
            res["failover_s"] = None
    res["load_average_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    res["cpus"] = os.cpu_count()
    rows = [
        ("clients / runs", f"{res['clients']} / {res['runs']}"),
        ("api submits/s", f"{res['api_submits_per_s']:.0f}"),
        ("direct submits/s", "-" if res["direct_submits_per_s"] is None
         else f"{res['direct_submits_per_s']:.0f}"),
        ("submit p50 / p99 ms", f"{res['submit_p50_ms']:.1f} / {res['submit_p99_ms']:.1f}"),
        ("server CPU ms/submit", f"{res['server_cpu_ms_per_submit']:.2f}"),
        ("PostgreSQL CPU ms/submit", f"{res['pg_cpu_ms_per_submit']:.2f}"),
        ("PostgreSQL sessions opened", f"{res['pg_sessions_submits']}"),
        ("client CPU ms/submit", f"{res['client_cpu_ms_per_submit']:.2f}"),
        ("list p50 / p99 ms", "-" if res["list_p99_ms"] is None
         else f"{res['list_p50_ms']:.1f} / {res['list_p99_ms']:.1f}"),
        ("server CPU ms/page", "-" if res["list_p99_ms"] is None
         else f"{res['server_cpu_ms_per_page']:.1f}"),
        ("PostgreSQL CPU ms/page", "-" if res["list_p99_ms"] is None
         else f"{res['pg_cpu_ms_per_page']:.1f}"),
        ("failover s", "-" if res["failover_s"] is None else f"{res['failover_s']:.2f}"),
        ("load average 1m", f"{res['load_average_1m']}"),
    ]  # fmt: skip
    for k, v in rows:
        print(f"{k:<26}{v}")
    for k, v in list(res.items()):
        if isinstance(v, float):
            res[k] = round(v, 2)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
