"""Set-up and measuring for ``api_throughput.py``: a store's tables dropped, a config, users
and their tokens, a server process started and stopped, and the CPU seconds of processes and of
the PostgreSQL backends serving a database (from /proc).

Invariants: nothing here times a phase (``api_throughput``'s phases do); a CPU figure is the
difference of two reads of the same processes (``cpu_s``, ``PgCpu``), which holds on a shared
machine where wall times do not. ``drop_tables`` drops ``TABLES`` whatever they hold: give the
benchmark a database of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

TABLES = ("runs", "events", "usage", "schema_version", "leader", "scheduler_status",
          "scheduler_cycles", "gpu_samples", "mlflow_runs", "users", "tokens", "memberships",
          "audit", "revision")  # fmt: skip


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
