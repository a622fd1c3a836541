"""The local backend against real processes: devices, logs, exit codes, max runtime, the
checkpoint signal with its grace, SIGKILL, process groups, handle checks, crash recovery."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from mlops_gpu.backends import HandleError, JobState, JobStatus, LaunchRequest
from mlops_gpu.backends.local import LocalBackend
from mlops_gpu.model import CheckpointPolicy
from mlops_gpu.testing import make_node, make_spec
from mlops_gpu.testing.builders import placed

PY = sys.executable


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend("local", [make_node("n1", 4)], tmp_path / "state", host="testhost")


def launch(
    b: LocalBackend, run_id: str, code: str, devices: list[str] | None = None, **spec_kw: object
) -> str:
    spec = make_spec(command=(PY, "-c", code), **spec_kw)  # type: ignore[arg-type]
    return b.launch(LaunchRequest(run_id, 1, spec, placed("n1", devices or ["0"])))


def wait_done(b: LocalBackend, handle: str, timeout: float = 20) -> JobStatus:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = b.poll([handle])[handle]
        if st.state not in (JobState.RUNNING, JobState.STARTING):
            return st
        time.sleep(0.05)
    raise AssertionError(f"{handle} still running after {timeout}s")


def wait_for(path: Path, timeout: float = 10) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def out(b: LocalBackend, run_id: str) -> str:
    return (b.attempt_dir(run_id, 1) / "stdout.log").read_text()


def test_devices_env_and_logs(backend: LocalBackend) -> None:
    code = (
        "import os,sys; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['MLOPS_GPU_RUN_ID'],"
        " os.environ['MLOPS_GPU_ATTEMPT']); print('oops', file=sys.stderr)"
    )
    h = launch(backend, "r1", code, ["2", "3"])
    st = wait_done(backend, h)
    assert (st.state, st.exit_code) == (JobState.SUCCEEDED, 0)
    assert out(backend, "r1").split() == ["2,3", "r1", "1"]
    files = backend.log_files("r1", 1)
    assert [f.name for f in files] == ["stdout.log", "stderr.log"]
    assert files[1].read_text() == "oops\n"


@pytest.mark.parametrize(
    ("code", "exit_code", "state"),
    [
        ("raise SystemExit(0)", 0, JobState.SUCCEEDED),
        ("raise SystemExit(3)", 3, JobState.FAILED),
        ("import os,signal; os.kill(os.getpid(), signal.SIGKILL)", -9, JobState.FAILED),
    ],
    ids=["zero", "three", "killed"],
)
def test_exit_codes(backend: LocalBackend, code: str, exit_code: int, state: JobState) -> None:
    st = wait_done(backend, launch(backend, "r", code))
    assert (st.state, st.exit_code, st.reason) == (state, exit_code, "exited")


def test_missing_executable_is_a_failed_run(backend: LocalBackend) -> None:
    spec = make_spec(command=("/no/such/binary",))
    h = backend.launch(LaunchRequest("r", 1, spec, placed("n1", ["0"])))
    st = wait_done(backend, h)
    assert (st.state, st.exit_code, st.reason) == (JobState.FAILED, 127, "exec_failed")
    assert "cannot start" in (backend.attempt_dir("r", 1) / "stderr.log").read_text()


def test_max_runtime_stops_the_run(backend: LocalBackend) -> None:
    t0 = time.time()
    h = launch(
        backend,
        "r",
        "import time; time.sleep(60)",
        max_runtime_s=0.5,
        checkpoint=CheckpointPolicy("SIGTERM", 5),
    )
    st = wait_done(backend, h)
    assert st.state is JobState.FAILED and st.reason == "max_runtime"
    assert time.time() - t0 < 10


def test_cancel_sends_checkpoint_signal_then_job_exits(
    backend: LocalBackend, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    code = f"""
import signal, sys, time, pathlib
def on_sig(s, f):
    pathlib.Path({str(tmp_path / "ckpt")!r}).write_text(str(s)); sys.exit(0)
signal.signal(signal.SIGUSR1, on_sig)
pathlib.Path({str(ready)!r}).touch()
time.sleep(60)
"""
    h = launch(backend, "r", code, checkpoint=CheckpointPolicy("SIGUSR1", 10))
    wait_for(ready)
    backend.cancel(h, "SIGUSR1", 10)
    st = wait_done(backend, h)
    assert (st.exit_code, st.reason) == (0, "stopped")
    assert (tmp_path / "ckpt").read_text() == "10"  # SIGUSR1


def test_sigkill_after_grace_reaches_the_whole_group(backend: LocalBackend, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    # The job ignores SIGTERM and leaves a grandchild that ignores it too.
    code = f"""
import signal, subprocess, sys, time, pathlib
signal.signal(signal.SIGTERM, signal.SIG_IGN)
p = subprocess.Popen([sys.executable, '-c',
    'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])
pathlib.Path({str(tmp_path / "grandchild")!r}).write_text(str(p.pid))
pathlib.Path({str(ready)!r}).touch()
time.sleep(60)
"""
    h = launch(backend, "r", code)
    wait_for(ready)
    t0 = time.time()
    backend.cancel(h, "SIGTERM", 0.5)
    st = wait_done(backend, h)
    assert st.exit_code == -9 and st.reason == "stopped"
    assert 0.4 < time.time() - t0 < 8
    gpid = int((tmp_path / "grandchild").read_text())
    deadline = time.time() + 5
    while Path(f"/proc/{gpid}").exists() and time.time() < deadline:
        status = Path(f"/proc/{gpid}/status").read_text()
        if "State:\tZ" in status:
            break
        time.sleep(0.05)
    assert (
        not Path(f"/proc/{gpid}").exists()
        or "State:\tZ" in Path(f"/proc/{gpid}/status").read_text()
    )


@pytest.mark.parametrize(
    "handle",
    [
        "slurm:c:1",
        "local:otherhost:r:1:1",
        "local:testhost:r:x:1",
        "local:testhost:r",
    ],
    ids=["other-kind", "other-host", "bad-attempt", "short"],
)
def test_foreign_handles_are_refused(backend: LocalBackend, handle: str) -> None:
    with pytest.raises(HandleError):
        backend.cancel(handle, "SIGTERM", 1)


def test_stale_pid_is_refused_and_reported_lost(backend: LocalBackend) -> None:
    h = launch(backend, "r", "pass")
    wait_done(backend, h)
    pid = int(h.rsplit(":", 1)[1])
    if pid in backend._children:  # the supervisor may still be exiting after its exit record
        backend._children[pid].wait(timeout=10)
    (backend.attempt_dir("r", 1) / "exit.json").unlink()  # as if the supervisor died hard
    st = backend.poll([h])[h]
    assert st.state is JobState.LOST
    with pytest.raises(HandleError):
        backend.cancel(h, "SIGTERM", 1)


def test_find_recovers_the_handle_after_a_restart(backend: LocalBackend, tmp_path: Path) -> None:
    h = launch(backend, "r", "import time; time.sleep(1)")
    fresh = LocalBackend("local", backend.inventory(), tmp_path / "state", host="testhost")
    assert fresh.find("r", 1) == h
    assert fresh.find("r", 2) is None and fresh.find("other", 1) is None
    assert wait_done(fresh, h).state is JobState.SUCCEEDED
