"""``mlops-gpu scheduler status|stop|restart`` and the "no scheduler" line of ``queue`` and
``status``, as a user runs them: the CLI as subprocesses, the scheduler a real background
process started by ``submit``."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from conftest import run_cli

from mlops_gpu.cli.scheduler_cmd import NO_SCHEDULER
from mlops_gpu.state.heartbeat import pid_alive
from mlops_gpu.testing import config_yaml

QUICK = {"mlflow": {"enabled": False}, "scheduler": {"tick_s": 0.2, "idle_exit_s": 120}}


def _status(cfg: Path) -> tuple[int, dict[str, Any]]:
    r = run_cli("--config", str(cfg), "scheduler", "status", "--json")
    return r.returncode, json.loads(r.stdout)


def _wait_running(cfg: Path, timeout: float = 30) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        rc, st = _status(cfg)
        if rc == 0 and st.get("last_tick_at"):
            return st
        time.sleep(0.2)
    raise AssertionError("the scheduler did not report running")


def test_status_stop_restart_and_the_no_scheduler_line(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(extra=QUICK))
    base = ("--config", str(cfg))

    rc, st = _status(cfg)  # nothing ever ran
    assert rc == 3 and st["running"] is False and st["store"].endswith("state.db")
    human = run_cli(*base, "scheduler", "status")
    assert human.returncode == 3 and NO_SCHEDULER in human.stdout

    # queue and status say so on stderr, never inside their JSON
    for verb in ("queue", "status"):
        r = run_cli(*base, verb, "--json")
        assert r.returncode == 0 and json.loads(r.stdout) == []
        assert r.stderr.strip() == f"mlops-gpu: {NO_SCHEDULER}"

    # submit starts one in the background: status shows it
    r = run_cli(*base, "submit", "-p", "p", "--", sys.executable, "-c", "pass")
    assert r.returncode == 0, r.stderr
    st = _wait_running(cfg)
    digest = hashlib.sha256(cfg.read_bytes()).hexdigest()
    assert st["pid"] > 0 and pid_alive(st["pid"]) and st["uptime_s"] >= 0
    assert st["engine"] in ("reference", "native") and st["ticks"] >= 1
    assert st["last_tick_age_s"] < 5 and st["idle_exit_s"] == 120
    assert st["config"]["path"] == str(cfg.resolve()) and st["config"]["sha256"] == digest
    assert st["config"]["file_changed"] is False and st["config"]["error"] is None
    human = run_cli(*base, "scheduler", "status")
    assert human.returncode == 0
    assert f"pid {st['pid']}" in human.stdout and digest[:12] in human.stdout
    for verb in ("queue", "status"):
        assert NO_SCHEDULER not in run_cli(*base, verb).stderr

    # an edit of a restart-only section (more GPUs): loaded, and status says it waits
    cfg.write_text(config_yaml(nodes=[("node-a", 8)], extra=QUICK))
    deadline = time.time() + 30
    while _status(cfg)[1]["config"]["restart_needed"] != ["backends"]:
        assert time.time() < deadline, _status(cfg)
        time.sleep(0.2)
    assert "backends changed: applied at" in run_cli(*base, "scheduler", "status").stdout

    # restart: a new process, the same idle exit, the whole file applied
    r = run_cli(*base, "scheduler", "restart")
    assert r.returncode == 0, r.stderr
    assert f"was pid {st['pid']}" in r.stdout
    assert not pid_alive(st["pid"])
    st2 = _wait_running(cfg)
    assert st2["pid"] != st["pid"] and st2["idle_exit_s"] == 120
    assert st2["config"]["restart_needed"] == []

    # stop: graceful, waits for the exit
    r = run_cli(*base, "scheduler", "stop")
    assert r.returncode == 0 and f"scheduler pid {st2['pid']} stopped" in r.stdout, r.stderr
    assert not pid_alive(st2["pid"])
    rc, st3 = _status(cfg)
    assert rc == 3 and st3["running"] is False and st3["stopped_at"] is not None
    assert NO_SCHEDULER in run_cli(*base, "queue").stderr
    r = run_cli(*base, "scheduler", "stop")
    assert r.returncode == 0 and "no scheduler is running" in r.stdout


def test_plain_scheduler_verbs_keep_working(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(extra=QUICK))
    base = ("--config", str(cfg))
    run_cli(*base, "submit", "-p", "p", "--no-start", "--", "true")
    r = run_cli(*base, "scheduler", "--once")
    assert r.returncode == 0 and "admitted 1" in r.stderr, r.stderr
    r = run_cli(*base, "scheduler", "run", "--once")
    assert r.returncode == 0 and "admitted 0" in r.stderr, r.stderr
    r = run_cli(*base, "scheduler", "--once", "status")
    assert r.returncode == 2 and "--once" in r.stderr and "Traceback" not in r.stderr
    # the foreground daemon with an idle exit, as `submit` starts it
    r = run_cli(*base, "scheduler", "--idle-exit", "0.5", timeout=60)
    assert r.returncode == 0, r.stderr
    rc, st = _status(cfg)
    assert rc == 3 and st["stopped_at"] is not None


def test_stop_waits_and_says_so_when_the_scheduler_does_not_exit(tmp_path: Path) -> None:
    import signal
    import subprocess

    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(extra=QUICK))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(cfg), "scheduler"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        st = _wait_running(cfg)
        assert st["pid"] == proc.pid
        os.kill(proc.pid, signal.SIGSTOP)  # a scheduler stuck in a tick
        r = run_cli("--config", str(cfg), "scheduler", "stop", "--timeout", "1")
        assert r.returncode == 1 and "still running 1s after SIGTERM" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        os.kill(proc.pid, signal.SIGCONT)  # it gets the SIGTERM now and exits
        proc.wait(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _heartbeat_round_trip(url: str) -> None:
    import dataclasses
    import socket

    from mlops_gpu.state import Store
    from mlops_gpu.state import heartbeat as hb

    store = Store(url)
    try:
        hb.publish_start(store, idle_exit_s=None, config_path="/x.yaml", config_hash="ab",
                         config_mtime=1.0, version="t")  # fmt: skip
        hb.beat(store, tick_at=5.0, ticks=3, engine="reference")
        hb.publish_config_error(store, "x.yaml: projects: bad")
        info = hb.read(store)
        assert info is not None and info.pid == os.getpid() and info.ticks == 3
        assert info.engine == "reference" and info.config_error == "x.yaml: projects: bad"
        import subprocess

        sleep = "import time; time.sleep(60)"
        ours = subprocess.Popen([sys.executable, "-c", sleep, "mlops_gpu.cli.main"])
        other = subprocess.Popen([sys.executable, "-c", sleep])  # (a pid reused by another)
        try:
            assert hb.is_running(dataclasses.replace(info, pid=ours.pid))
            assert not hb.is_running(dataclasses.replace(info, pid=other.pid))
        finally:
            for p in (ours, other):
                p.kill()
                p.wait()
        assert not hb.is_running(dataclasses.replace(info, pid=ours.pid))  # exited
        elsewhere = dataclasses.replace(info, host=socket.gethostname() + "-other")
        assert hb.is_running(elsewhere, now=info.beat_at + 1)
        assert not hb.is_running(elsewhere, now=info.beat_at + hb.STALE_S + 1)
        hb.publish_config(store, config_hash="cd", config_mtime=2.0)
        hb.publish_stop(store)
        info = hb.read(store)
        assert info is not None and info.config_hash == "cd" and info.config_error is None
        assert not hb.is_running(info)
        # a scheduler that died without a word (its pid gone) is not running
        assert not hb.is_running(dataclasses.replace(info, stopped_at=None, pid=2**22 + 7))
    finally:
        store.close()


def test_heartbeat_sqlite(tmp_path: Path) -> None:
    _heartbeat_round_trip(f"sqlite:///{tmp_path / 'state.db'}")


def test_heartbeat_postgres(pg_store_url: str) -> None:
    _heartbeat_round_trip(pg_store_url)
