"""The ``local`` backend: runs on this host as subprocesses, one supervisor per run attempt.

Nodes are either real (one node per host, devices = NVML indices) or virtual (any number of
named nodes with virtual device ids, for the demo and for machines without GPUs); processes run
on this host either way, with ``CUDA_VISIBLE_DEVICES`` set to the placement's devices.

Each attempt has a directory ``<state_dir>/runs/<run_id>/<attempt>/`` holding ``launch.json``
(written before the process starts), ``runner.pid``, ``child.pid``, ``stdout.log``,
``stderr.log``, ``telemetry.json`` (the launcher's summary, when the run goes through
``mlops-gpu exec``) and, once the run ended, ``exit.json``. The directory is the source of
truth after a scheduler crash: supervisors run in their own sessions and outlive the scheduler.

Handle: ``local:<host>:<run_id>:<attempt>:<supervisor pid>``; before signalling, the pid's
command line must still name the run (pids are reused).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mlops_gpu.backends.base import (
    HandleError,
    JobState,
    JobStatus,
    JobTelemetry,
    LaunchError,
    LaunchRequest,
    job_env,
)
from mlops_gpu.model import BackendCapabilities, Node


class LocalBackend:
    kind = "local"
    # One host: no gangs. MIG slices and shared devices are set in CUDA_VISIBLE_DEVICES.
    capabilities = BackendCapabilities(
        multi_node=False, mig=True, shared_gpus=True, checkpoint_signal=True
    )

    def __init__(
        self, name: str, nodes: Sequence[Node], state_dir: Path, host: str | None = None
    ) -> None:
        self.name = name
        self._nodes = list(nodes)
        self.state_dir = Path(state_dir)
        self.host = host or socket.gethostname()
        # Popen objects of supervisors we started, so their exits are reaped (no zombies).
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # -- interface ------------------------------------------------------------------------
    def inventory(self) -> list[Node]:
        return list(self._nodes)

    def attempt_dir(self, run_id: str, attempt: int) -> Path:
        return self.state_dir / "runs" / run_id / str(attempt)

    def launch(self, req: LaunchRequest) -> str:
        if len(req.placement.slots) != 1:
            raise LaunchError("the local backend runs single-node placements only")
        slot = req.placement.slots[0]
        d = self.attempt_dir(req.run_id, req.attempt)
        ckpt = self.state_dir / "checkpoints" / req.run_id
        try:
            d.mkdir(parents=True, exist_ok=True)
            ckpt.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LaunchError(f"cannot create {d}: {e}") from e
        env = dict(os.environ)
        env.update(job_env(req, str(ckpt)))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(slot.devices)
        spec = req.spec
        cmd = [
            sys.executable,
            "-m",
            "mlops_gpu.backends.runner",
            "--dir",
            str(d),
            "--signal",
            spec.checkpoint.signal,
            "--grace",
            str(spec.checkpoint.grace_s),
        ]
        if spec.max_runtime_s is not None:
            cmd += ["--max-runtime", str(spec.max_runtime_s)]
        if req.launcher is not None:
            # Through the launcher: it samples the run's GPUs and passes the stop signal on.
            tfile = str(d / "telemetry.json")
            cmd += [
                "--leader-signal",
                "--",
                *req.launcher.argv(sys.executable, spec.command, tfile),
            ]
        else:
            cmd += ["--", *spec.command]
        (d / "launch.json").write_text(
            json.dumps(
                {
                    "run_id": req.run_id,
                    "attempt": req.attempt,
                    "node": slot.node,
                    "devices": list(slot.devices),
                    "command": list(spec.command),
                    "time": time.time(),
                }
            )
        )
        cwd = spec.workdir or None
        if cwd is not None and not Path(cwd).is_dir():
            raise LaunchError(f"workdir {cwd} does not exist")
        try:
            with open(d / "runner.log", "ab") as log:
                proc = subprocess.Popen(
                    cmd,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as e:
            raise LaunchError(f"cannot start the supervisor: {e}") from e
        self._children[proc.pid] = proc
        (d / "runner.pid").write_text(str(proc.pid))
        return self._handle(req.run_id, req.attempt, proc.pid)

    def poll(self, handles: Sequence[str]) -> dict[str, JobStatus]:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]
        return {h: self._status(h) for h in handles}

    def cancel(self, handle: str, signal_name: str, grace_s: float) -> None:
        run_id, attempt, pid = self._parse(handle)
        d = self.attempt_dir(run_id, attempt)
        if (d / "exit.json").exists():
            return
        if not self._alive(pid, run_id):
            raise HandleError(f"{handle}: process {pid} no longer runs this run")
        tmp = d / "stop.tmp"
        tmp.write_text(json.dumps({"signal": signal_name, "grace": grace_s}))
        os.replace(tmp, d / "stop.json")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)

    def find(self, run_id: str, attempt: int) -> str | None:
        d = self.attempt_dir(run_id, attempt)
        if not (d / "launch.json").exists():
            return None
        pid_file = d / "runner.pid"
        # The launch may have been cut between Popen and writing runner.pid: the supervisor
        # writes it too, first thing, so wait for it briefly.
        deadline = time.time() + 3.0
        while not pid_file.exists() and time.time() < deadline:
            time.sleep(0.05)
        if not pid_file.exists():
            return None
        return self._handle(run_id, attempt, int(pid_file.read_text().strip()))

    def log_files(self, run_id: str, attempt: int) -> list[Path]:
        d = self.attempt_dir(run_id, attempt)
        return [p for p in (d / "stdout.log", d / "stderr.log") if p.exists()]

    # -- helpers --------------------------------------------------------------------------
    def _handle(self, run_id: str, attempt: int, pid: int) -> str:
        return f"local:{self.host}:{run_id}:{attempt}:{pid}"

    def _parse(self, handle: str) -> tuple[str, int, int]:
        parts = handle.split(":")
        if len(parts) != 5 or parts[0] != "local":
            raise HandleError(f"{handle!r} is not a local backend handle")
        if parts[1] != self.host:
            raise HandleError(f"{handle!r} belongs to host {parts[1]}, not {self.host}")
        try:
            return parts[2], int(parts[3]), int(parts[4])
        except ValueError as e:
            raise HandleError(f"{handle!r}: malformed attempt or pid") from e

    def _alive(self, pid: int, run_id: str) -> bool:
        proc = self._children.get(pid)
        if proc is not None:
            # Our own child: right after fork its command line is still ours, so ask the
            # Popen object instead of /proc.
            return proc.poll() is None
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            return False
        except OSError:  # no procfs: fall back to existence only
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return True
        if "\nState:\tZ" in status or "\nState:\tX" in status:
            return False  # exited, not yet reaped
        # An empty command line is a process inside exec(): not yet the supervisor, but alive.
        return not cmdline or run_id.encode() in cmdline

    def _status(self, handle: str) -> JobStatus:
        run_id, attempt, pid = self._parse(handle)
        d = self.attempt_dir(run_id, attempt)
        exit_file = d / "exit.json"
        if not exit_file.exists() and self._alive(pid, run_id):
            return JobStatus(handle, JobState.RUNNING, telemetry=self._telemetry(d))
        try:
            info = json.loads(exit_file.read_text())
        except (FileNotFoundError, ValueError):
            return JobStatus(
                handle, JobState.LOST, reason=f"supervisor {pid} is gone and left no exit record"
            )
        code = int(info["exit_code"])
        return JobStatus(
            handle,
            JobState.SUCCEEDED if code == 0 else JobState.FAILED,
            exit_code=code,
            started_at=info.get("started_at"),
            finished_at=info.get("finished_at"),
            reason=str(info.get("reason", "exited")),
            telemetry=self._telemetry(d),
        )

    @staticmethod
    def _telemetry(d: Path) -> JobTelemetry | None:
        """The launcher's summary, if it wrote one (a run launched bare has none)."""
        try:
            return JobTelemetry.from_dict(json.loads((d / "telemetry.json").read_text()))
        except (OSError, ValueError, AttributeError):
            return None
