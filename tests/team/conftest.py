"""A real ``mlops-gpu server`` process on a loopback port, with users made in its store.

``team``: projects ``p`` and ``q``; users ``root`` (admin), ``mara`` (maintainer of p, from the
config), ``mem`` and ``peer`` (members of p, stored), ``vic`` (viewer of p, from the config),
``qm`` (member of q), ``nobody`` (no role), ``spare`` (target of membership changes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import _free_port

from mlops_gpu.testing import config_yaml

USERS: dict[str, tuple[bool, dict[str, str]]] = {
    "root": (True, {}),
    "mara": (False, {}),  # maintainer of p: from the config's members
    "mem": (False, {"p": "member"}),
    "peer": (False, {"p": "member"}),
    "vic": (False, {}),  # viewer of p: from the config's members
    "qm": (False, {"q": "member"}),
    "nobody": (False, {}),
    "spare": (False, {}),
}


def team_config(store: str, extra: dict[str, Any] | None = None) -> str:
    data = yaml.safe_load(config_yaml(projects={"p": (4, 0), "q": (4, 0)}))
    data["store"] = store
    data["projects"]["p"]["members"] = {"mara": "maintainer", "vic": "viewer"}
    data["mlflow"] = {"enabled": False}
    data["telemetry"] = {"launcher": False}
    data.update(extra or {})
    return str(yaml.safe_dump(data, sort_keys=False))


@dataclass
class Server:
    url: str
    cfg: Path
    proc: subprocess.Popen[bytes]
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)
    verify: Any = True

    def client(self, who: str | None = None, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, verify=self.verify,
                            **kw)  # fmt: skip

    def store(self) -> Any:
        from mlops_gpu.config import load_config
        from mlops_gpu.state import Store

        return Store(load_config(self.cfg).store_url)

    def counts(self) -> tuple[int, int]:
        """(runs, events) in the server's store."""
        from sqlalchemy import func, select

        from mlops_gpu.state.schema import events, runs

        store = self.store()
        try:
            with store.engine.connect() as conn:
                return (
                    int(conn.execute(select(func.count()).select_from(runs)).scalar_one()),
                    int(conn.execute(select(func.count()).select_from(events)).scalar_one()),
                )
        finally:
            store.close()


def add_users(cfg: Path, users: dict[str, tuple[bool, dict[str, str]]]) -> dict[str, str]:
    from mlops_gpu.config import load_config
    from mlops_gpu.state import Store
    from mlops_gpu.state.users import add_user

    store = Store(load_config(cfg).store_url)
    try:
        return {
            name: add_user(store, name, admin=admin, projects=roles, ttl_s=86400)
            for name, (admin, roles) in users.items()
        }
    finally:
        store.close()


def start_server(
    cfg: Path, *args: str, env: dict[str, str] | None = None, scheme: str = "http"
) -> Server:
    port = _free_port()
    log = cfg.parent / f"server-{port}.log"
    out = open(log, "wb")  # noqa: SIM115 - the process holds it
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(cfg), "server",
         "--port", str(port), *args],
        stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
    )  # fmt: skip
    srv = Server(f"{scheme}://127.0.0.1:{port}", cfg, proc, log)
    if "--certfile" in args:
        import ssl

        srv.verify = ssl.create_default_context(cafile=args[args.index("--certfile") + 1])
    deadline = time.monotonic() + 90
    while True:
        try:
            with srv.client() as c:
                if c.get("/livez").status_code == 200:
                    return srv
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(srv)
            raise RuntimeError(f"server did not start: {log.read_text()[-3000:]}")
        time.sleep(0.2)


def stop_server(srv: Server) -> None:
    if srv.proc.poll() is None:
        srv.proc.terminate()
        try:
            srv.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()


def no_5xx(srv: Server) -> None:
    """The server never answered 5xx, and never wrote a traceback to its log."""
    text = srv.log.read_text(errors="replace")
    assert "Traceback" not in text, text[-4000:]


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """make_server(store_url, *server_args, extra=config_extra, users=USERS, env=...)."""
    started: list[Server] = []

    def make(
        store: str | None = None,
        *args: str,
        extra: dict[str, Any] | None = None,
        users: dict[str, tuple[bool, dict[str, str]]] | None = None,
        env: dict[str, str] | None = None,
        scheme: str = "http",
    ) -> Server:
        d = tmp_path / f"srv{len(started)}"
        d.mkdir()
        cfg = d / "mlops-gpu.yaml"
        cfg.write_text(team_config(store or "sqlite:///state.db", extra))
        tokens = add_users(cfg, USERS if users is None else users)
        srv = start_server(cfg, *args, env=env, scheme=scheme)
        srv.tokens = tokens
        started.append(srv)
        return srv

    yield make
    for srv in started:
        stop_server(srv)
