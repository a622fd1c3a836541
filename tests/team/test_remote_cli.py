"""The CLI in remote mode against a real server, as a user on a laptop: ``login`` (credentials
mode 0600), then ``submit``, ``status``, ``queue`` and ``cancel`` with no config and no store
on the client, printing what local mode prints; the run's user is the token's."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

from conftest import run_cli

from team.conftest import Server, no_5xx


def test_remote_cli_round_trip(make_server: Callable[..., Server], tmp_path: Path) -> None:
    srv = make_server()
    home = tmp_path / "laptop"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": "", "MLOPS_GPU_CONFIG": "",
           "MLOPS_GPU_USER": "root", "MLOPS_GPU_URL": "", "MLOPS_GPU_TOKEN": ""}  # fmt: skip

    def cli(*args: str) -> tuple[int, str, str]:
        r = run_cli(*args, cwd=home, env=env)
        return r.returncode, r.stdout, r.stderr

    rc, out, err = cli("login", srv.url, "--token", srv.tokens["mem"])
    assert rc == 0, err
    cred = home / ".config" / "mlops-gpu" / "credentials"
    assert out.strip() == f"logged in to {srv.url} as mem; credentials in {cred}"
    assert stat.S_IMODE(cred.stat().st_mode) == 0o600
    rc, out, err = cli("submit", "-p", "p", "--", "sh", "-c", "echo hi")
    assert rc == 0, err
    rid = out.strip()
    deadline = time.monotonic() + 60
    while True:
        rc, out, err = cli("status", rid, "--json")
        assert rc == 0, err
        run = json.loads(out)[0]
        if run["phase"] == "succeeded":
            break
        assert time.monotonic() < deadline, run
        time.sleep(0.3)
    assert run["user"] == "mem"  # not MLOPS_GPU_USER
    # the same JSON as local mode on the server's machine
    local = run_cli("--config", str(srv.cfg), "status", rid, "--json")
    assert json.loads(local.stdout) == [run]
    # logs: the same bytes as local mode; followed
    rc, out, err = cli("logs", rid)
    assert (rc, out) == (0, "hi\n"), err
    local = run_cli("--config", str(srv.cfg), "logs", rid)
    assert local.stdout == out
    rc, out, err = cli("submit", "-p", "p", "--", "sh", "-c", "echo a; sleep 1; echo b")
    rc, out, err = cli("logs", "-f", out.strip())
    assert (rc, out) == (0, "a\nb\n"), err
    rc, out, err = cli("submit", "-p", "p", "--gpus", "4", "--", "sleep", "600")
    long_id = out.strip()
    rc, out, err = cli("submit", "-p", "p", "--gpus", "4", "--", "sleep", "600")
    waiting = out.strip()
    deadline = time.monotonic() + 30
    while True:
        rc, out, err = cli("queue", "--json")
        q = json.loads(out)
        if [r["id"] for r in q] == [waiting] and q[0]["reason"]:
            break
        assert time.monotonic() < deadline, q
        time.sleep(0.3)
    rc, out, err = cli("queue")
    assert rc == 0 and "Queue: 1 pending" in out and waiting in out, out + err
    local = run_cli("--config", str(srv.cfg), "queue")

    def same(text: str) -> str:  # the table without its AGE cells (the clock moves on)
        return re.sub(r"│\d+[smhd]│", "│AGE│", re.sub(r"[ ─━┈]+", "", text))

    assert same(local.stdout) == same(out), (local.stdout, out)
    rc, out, err = cli("status")
    assert rc == 0 and long_id in out and rid in out
    rc, out, err = cli("logs", waiting)  # pending: no logs yet, as local mode says it
    local = run_cli("--config", str(srv.cfg), "logs", waiting)
    assert (rc, err) == (local.returncode, local.stderr) == (
        0,
        local.stderr,
    ) and "no logs yet" in err
    rc, out, err = cli("nodes", "--json")
    assert json.loads(out) == json.loads(
        run_cli("--config", str(srv.cfg), "nodes", "--json").stdout
    )
    assert json.loads(out)[0]["runs"] == [long_id]
    rc, out, err = cli("nodes")
    assert rc == 0 and "node-a" in out and long_id in out
    rc, out, err = cli("cancel", waiting, long_id)
    assert rc == 0, err
    assert out.splitlines() == [f"{waiting}: cancelled",
        f"{long_id}: stopping (checkpoint signal, then SIGKILL after the grace)"]  # fmt: skip
    # another project's run does not exist for mem
    with srv.client("qm") as c:
        theirs = c.post("/api/v1/runs", json={"command": ["true"], "project": "q"}).json()["id"]
    rc, out, err = cli("status", theirs)
    assert rc == 2 and err.strip() == f"mlops-gpu: error: no run with id {theirs!r}"
    rc, out, err = cli("cancel", theirs)
    assert rc == 2 and "no run with id" in err
    # a project without a role: the server's one line
    rc, out, err = cli("submit", "-p", "q", "--", "true")
    assert rc == 2 and "you cannot submit to project 'q'" in err and "Traceback" not in err
    no_5xx(srv)


def test_remote_errors_are_one_line(make_server: Callable[..., Server], tmp_path: Path) -> None:
    srv = make_server(None, "--no-scheduler")
    home = tmp_path / "laptop"
    home.mkdir()
    base = {"HOME": str(home), "XDG_CONFIG_HOME": "", "MLOPS_GPU_CONFIG": ""}
    r = run_cli("login", srv.url, "--token", "mgt_wrong", cwd=home, env=base)
    assert r.returncode == 2 and r.stderr.strip() == \
        f"mlops-gpu: error: {srv.url}: invalid, expired or revoked token"  # fmt: skip
    assert not (home / ".config" / "mlops-gpu" / "credentials").exists()
    env = {**base, "MLOPS_GPU_URL": "http://127.0.0.1:9", "MLOPS_GPU_TOKEN": "mgt_x"}
    r = run_cli("queue", cwd=home, env=env)
    assert r.returncode == 2 and "cannot reach the server http://127.0.0.1:9" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    env = {**base, "MLOPS_GPU_URL": srv.url, "MLOPS_GPU_TOKEN": srv.tokens["mem"]}
    assert run_cli("queue", "--json", cwd=home, env=env).stdout.strip() == "[]"
    # a credentials file others can read is refused
    r = run_cli("login", srv.url, "--token", srv.tokens["mem"], cwd=home, env=base)
    assert r.returncode == 0, r.stderr
    cred = home / ".config" / "mlops-gpu" / "credentials"
    os.chmod(cred, 0o644)
    r = run_cli("queue", cwd=home, env=base)
    assert r.returncode == 2 and "readable by others" in r.stderr
