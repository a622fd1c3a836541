"""One leader per store, whatever happens to files beside it: the lease lives in the store and
every write of a leader is fenced by its epoch (``state/lease.py``, ``state/lock.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import pytest
import yaml
from conftest import run_cli
from sqlalchemy import update

from mlops_gpu.config import load_config
from mlops_gpu.model import TERMINAL_PHASES
from mlops_gpu.state import LeaderLock, LeadershipLost, Store
from mlops_gpu.state.lock import current_holder
from mlops_gpu.state.schema import leader
from mlops_gpu.testing import config_yaml
from mlops_gpu.testing.builders import make_spec, placed


@pytest.fixture
def two(store_url: str) -> Iterator[tuple[Store, Store]]:
    """Two processes' views of one store (two engines)."""
    a, b = Store(store_url), Store(store_url)
    yield a, b
    a.close()
    b.close()


def expire(store: Store) -> None:
    """What a leader stopped past its lease looks like from the store."""
    with store.engine.begin() as conn:
        conn.execute(update(leader).values(expires_at=time.time() - 1))


def test_a_leader_replaced_past_its_lease_commits_nothing_more(two: tuple[Store, Store]) -> None:
    a_store, b_store = two
    run_id = a_store.submit(make_spec()).id
    a, b = LeaderLock(a_store), LeaderLock(b_store)
    assert a.acquire() and a.epoch == 1
    assert not b.acquire()  # it holds the lease
    a.renew()
    expire(a_store)
    assert b.acquire() and b.epoch == 2  # taken over, a higher epoch
    with pytest.raises(LeadershipLost, match="epoch 1"):
        a_store.admit(run_id, placed("node-a", ["0"]))
    with pytest.raises(LeadershipLost):
        a.renew()
    assert a_store.get(run_id).phase.value == "pending"  # refused whole: nothing committed
    assert b_store.admit(run_id, placed("node-a", ["0"]))  # the new leader's admission holds
    b.release()
    assert current_holder(a_store) is None


def test_two_locks_of_one_process_exclude_each_other_and_release_hands_over(
    two: tuple[Store, Store],
) -> None:
    a_store, _ = two
    a, b = LeaderLock(a_store), LeaderLock(a_store)
    assert a.acquire() and not b.acquire()
    a.release()
    assert b.acquire() and b.epoch == 2
    b.release()


# -- real schedulers ---------------------------------------------------------------------------
JOB = """
import os, sys, time
path, rid = sys.argv[1], os.environ['MLOPS_GPU_RUN_ID']
dev = os.environ['CUDA_VISIBLE_DEVICES']
t0 = time.time()
time.sleep(float(sys.argv[2]))
with open(path, 'a') as f:
    f.write(f"{rid} {dev} {t0} {time.time()}\\n")
"""


def setup(tmp_path: Path, lease_s: float = 30.0, tick_s: float = 0.1) -> Path:
    cfg = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)], projects={"p": (4, 0)}))
    data["scheduler"] = {"tick_s": tick_s, "lease_s": lease_s}
    cfg.write_text(yaml.safe_dump(data))
    (tmp_path / "job.py").write_text(JOB)
    return cfg


def scheduler(cfg: Path, log: str = "sched.log") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(cfg), "scheduler"],
        stdout=subprocess.DEVNULL,
        stderr=open(cfg.parent / log, "ab"),
        start_new_session=True,
    )


def wait_for(cond: object, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGCONT)
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def submit(cfg: Path, trace: Path, seconds: float, gpus: int = 2) -> str:
    job = str(cfg.parent / "job.py")
    r = run_cli("--config", str(cfg), "submit", "--no-start", "-p", "p", "-g", str(gpus), "--",
                sys.executable, job, str(trace), str(seconds))  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.slow
def test_removing_files_beside_the_store_lets_no_second_leader_start(tmp_path: Path) -> None:
    """Deleting the old lock file let a second scheduler start on the same SQLite store: now
    every file but the database itself may go, and the second still finds the leader."""
    cfg = setup(tmp_path)
    store = Store(load_config(cfg).store_url)
    first = scheduler(cfg)
    try:
        assert wait_for(lambda: current_holder(store) is not None), "the first never led"
        db = Path(load_config(cfg).store_url.split("///", 1)[1])
        keep = {db, Path(f"{db}-wal"), Path(f"{db}-shm"), cfg, tmp_path / "sched.log"}
        removed = [p for p in db.parent.rglob("*") if p.is_file() and p not in keep]
        for p in removed:
            p.unlink()
        second = subprocess.run(
            [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(cfg), "scheduler"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr
        assert "another scheduler is running" in second.stderr
        assert first.poll() is None
    finally:
        stop(first)


@pytest.mark.slow
def test_two_schedulers_started_at_once_one_leads(tmp_path: Path) -> None:
    cfg = setup(tmp_path)
    store = Store(load_config(cfg).store_url)
    for i in range(10):
        procs = [scheduler(cfg, f"s{i}-{k}.log") for k in range(2)]
        try:
            assert wait_for(lambda ps=procs: any(p.poll() is not None for p in ps), 60), i
            time.sleep(0.5)  # (a second leader would be up by now)
            alive = [p for p in procs if p.poll() is None]
            assert len(alive) == 1, (i, [p.returncode for p in procs])
            [lost] = [p for p in procs if p.poll() is not None]
            assert lost.returncode == 1
            holder = current_holder(store)
            assert holder is not None and holder.pid == alive[0].pid
        finally:
            stop(*procs)
        assert wait_for(lambda: current_holder(store) is None, 10)


@pytest.mark.slow
def test_a_paused_leader_is_replaced_and_fenced(tmp_path: Path) -> None:
    """SIGSTOP the leader past its lease, start another that admits, resume the first: the
    store refuses whatever the first tries to write, it exits, and no device is booked twice."""
    lease_s = 2.0
    cfg = setup(tmp_path, lease_s=lease_s, tick_s=0.5)
    trace = tmp_path / "trace.txt"
    store = Store(load_config(cfg).store_url)
    first = scheduler(cfg, "first.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        ids = [submit(cfg, trace, 1.0) for _ in range(2)]  # the first fills the node
        assert wait_for(lambda: all(store.get(i).started_at for i in ids)), "first never ran"
        ids += [submit(cfg, trace, 0.5) for _ in range(4)]  # queued while it is stopped
        for _ in range(3):
            os.killpg(first.pid, signal.SIGSTOP)  # (its runs live in their own sessions)
            time.sleep(lease_s + 0.5)
            second = scheduler(cfg, "second.log")
            if wait_for(lambda s=second: (h := current_holder(store)) is not None
                        and h.pid == s.pid and h.epoch >= 2, 15):  # fmt: skip
                break
            # Stopped inside a write transaction, SQLite's write lock stops every writer
            # (the second too) until it resumes: let it finish that one and stop it again.
            os.killpg(first.pid, signal.SIGCONT)
            stop(second)
            second = None
            time.sleep(0.3)
        assert second is not None, "the second scheduler never took over"
        assert wait_for(lambda: sum(bool(store.get(i).admitted_at) for i in ids[2:]) >= 1)
        os.killpg(first.pid, signal.SIGCONT)
        first.wait(timeout=30)
        assert first.returncode == 3
        assert "taken over" in (tmp_path / "first.log").read_text()
        assert wait_for(lambda: all(store.get(i).phase in TERMINAL_PHASES for i in ids), 60)
        assert {store.get(i).phase.value for i in ids} == {"succeeded"}
    finally:
        stop(first, *([second] if second else []))
    spans = [ln.split() for ln in trace.read_text().splitlines()]
    assert sorted(s[0] for s in spans) == sorted(ids)  # each ran once
    for a, b in combinations(spans, 2):
        if float(a[2]) < float(b[3]) and float(b[2]) < float(a[3]):
            assert not set(a[1].split(",")) & set(b[1].split(",")), (a, b)


def test_without_proc_a_holder_is_alive_while_its_pid_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where there is no /proc (macOS laptops), liveness falls back to the pid alone."""
    from mlops_gpu.state import lease

    monkeypatch.setattr(lease, "_HAS_PROC", False)
    mine = lease.new_holder()
    me = lease.Holder(mine, 1, time.time() + 30, os.getpid(), mine.split(":")[0])
    assert me.alive(time.time())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = lease.Holder(f"{me.host}:{dead.pid}:-:x", 1, time.time() + 30, dead.pid, me.host)
    assert not gone.alive(time.time())


def test_a_holder_that_exited_unreaped_is_gone() -> None:
    """A scheduler killed while its parent (a notebook that started it) never reaps it stays a
    zombie: its lease must not bind until it expires."""
    from mlops_gpu.state import lease

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while lease.process_key(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # (not waited for: it stays a zombie)
    assert lease.process_key(child.pid) is None
    host = lease.new_holder().split(":")[0]
    zombie = lease.Holder(f"{host}:{child.pid}:1:x", 1, time.time() + 30, child.pid, host)
    assert not zombie.alive(time.time())
    child.wait()
