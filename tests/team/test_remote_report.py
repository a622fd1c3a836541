"""``mlops-gpu report`` in remote mode prints what local mode prints on the server's machine
(for a user who sees every project with runs), with no config on the client."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from conftest import run_cli

from team.conftest import Server, no_5xx


def test_remote_report_matches_local(make_server: Callable[..., Server], tmp_path: Path) -> None:
    srv = make_server()
    home = tmp_path / "laptop"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": "", "MLOPS_GPU_CONFIG": "",
           "MLOPS_GPU_URL": srv.url, "MLOPS_GPU_TOKEN": srv.tokens["mem"]}  # fmt: skip
    with srv.client("mem") as c:
        ids = [c.post("/api/v1/runs", json={"command": ["true"], "project": "p"}).json()["id"]
               for _ in range(2)]  # fmt: skip
        deadline = time.monotonic() + 120
        while any(c.get(f"/api/v1/runs/{i}").json()["phase"] != "succeeded" for i in ids):
            assert time.monotonic() < deadline
            time.sleep(0.3)
    for fmt in ("json", "table", "csv"):
        remote = run_cli("report", "--by", "user", "--format", fmt, cwd=home, env=env)
        assert remote.returncode == 0, remote.stderr
        local = run_cli("--config", str(srv.cfg), "report", "--by", "user", "--format", fmt,
                        env={"MLOPS_GPU_URL": ""})  # fmt: skip
        assert remote.stdout == local.stdout
    rows = json.loads(run_cli("report", "--format", "json", cwd=home, env=env).stdout)["rows"]
    assert [(r["key"], r["runs"]) for r in rows] == [("p", 2)]
    bad = run_cli("report", "--since", "7x", cwd=home, env=env)
    assert bad.returncode == 2 and "--since" in bad.stderr
    assert not (home / ".config" / "mlops-gpu").exists()
    no_5xx(srv)
