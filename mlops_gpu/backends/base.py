"""The backend interface every placement target implements (in the manner of submitit's small
executor hooks and SkyPilot's capability flags).

Besides the protocol's methods a backend may have ``warm()``: get ready before there is work
(connect, fill caches, start watches). The daemon calls it through ``warm`` below at start and
before each tick; it must be cheap when already warm, and its failure is never fatal (the
tick that needs the backend reports the error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Protocol, runtime_checkable

from mlops_gpu.model import BackendCapabilities, Node, Placement, RunSpec


class LaunchError(RuntimeError):
    """The backend refused or failed to start a job; the admission is rolled back."""


class HandleError(ValueError):
    """A handle that is not this backend's, or that no longer names the job it was issued for."""


class JobState(str, Enum):
    #: Accepted by the backend, not yet running (e.g. Slurm PENDING, pod Pending).
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: The backend has no trace of the job and no record of how it ended.
    LOST = "lost"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class JobTelemetry:
    """What the job's launcher (``mlops-gpu exec``) measured, as far as the backend can read it."""

    #: Mean GPU utilization in percent over the run's devices and samples; None without one.
    mean_utilization: float | None = None
    #: Set while the run's GPUs have been idle for the whole idle window: since when.
    idle_since: float | None = None
    #: Seconds spent in idle stretches that reached the window (the window included).
    idle_s: float = 0.0
    #: The last sample of each device: (position among the run's devices, utilization
    #: percent, memory used MB), None where NVML gave no value; empty without samples.
    devices: tuple[tuple[int, float | None, float | None], ...] = ()
    #: When those samples were taken (the launcher's clock).
    sampled_at: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> JobTelemetry:
        def num(key: str, src: Mapping[str, object] = d) -> float | None:
            v = src.get(key)
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        devs = []
        raw = d.get("devices")
        for x in raw if isinstance(raw, list) else ():
            pos = x.get("position") if isinstance(x, dict) else None
            if isinstance(pos, int) and not isinstance(pos, bool) and pos >= 0:
                devs.append((pos, num("utilization_pct", x), num("memory_used_mb", x)))
        return cls(
            num("mean_utilization"),
            num("idle_since"),
            num("idle_s") or 0.0,
            tuple(devs),
            num("sampled_at"),
        )


@dataclass(frozen=True, slots=True)
class LauncherSettings:
    """How backends wrap a run's command in the job-side launcher (``[telemetry]`` config)."""

    interval_s: float = 10.0
    #: Utilization (percent) under which a sample counts as idle, on every device at once.
    idle_below_pct: float = 1.0
    #: Seconds of idle samples before the run is flagged; None: never.
    idle_after_s: float | None = 1800.0
    stop_idle: bool = False
    #: Pass a SIGTERM on to the command as this signal (Kubernetes: the checkpoint signal).
    term_signal: str | None = None

    def argv(self, python: str, command: Sequence[str], telemetry_file: str | None) -> list[str]:
        """``python -m mlops_gpu.telemetry.launcher ... -- command``: the light entry point,
        without the CLI's imports."""
        out = [python, "-m", "mlops_gpu.telemetry.launcher", "--interval", f"{self.interval_s:g}"]
        out += ["--idle-below", f"{self.idle_below_pct:g}"]
        if self.idle_after_s is not None:
            out += ["--idle-after", f"{self.idle_after_s:g}"]
        if self.stop_idle:
            out.append("--stop-idle")
        if telemetry_file:
            out += ["--telemetry-file", telemetry_file]
        if self.term_signal:
            out += ["--term-signal", self.term_signal]
        return [*out, "--", *command]


@dataclass(frozen=True, slots=True)
class JobStatus:
    handle: str
    state: JobState
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    #: Why it ended: "exited", "max_runtime", "stopped" (cancel or preempt), or a backend message.
    reason: str = ""
    telemetry: JobTelemetry | None = None


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    run_id: str
    attempt: int
    spec: RunSpec
    placement: Placement
    #: Extra environment for the job (MLOPS_GPU_RUN_ID, MLOPS_GPU_ATTEMPT, ...).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Wrap the command in ``mlops-gpu exec`` with these settings; None: run it bare.
    launcher: LauncherSettings | None = None


@runtime_checkable
class Backend(Protocol):
    name: str
    kind: str
    capabilities: BackendCapabilities

    def inventory(self) -> list[Node]:
        """Nodes this backend offers now (unschedulable ones flagged, not omitted)."""
        ...

    def launch(self, req: LaunchRequest) -> str:
        """Start the job on ``req.placement``; return its handle. Raises ``LaunchError``."""
        ...

    def poll(self, handles: Sequence[str]) -> dict[str, JobStatus]:
        """Status of many jobs in one batched call."""
        ...

    def cancel(self, handle: str, signal: str, grace_s: float) -> None:
        """Send ``signal`` to the job, SIGKILL after ``grace_s``. Raises ``HandleError``."""
        ...

    def find(self, run_id: str, attempt: int) -> str | None:
        """The handle of this run attempt's job if the backend has one (crash recovery)."""
        ...

    def log_files(self, run_id: str, attempt: int) -> list[Path]:
        """Files holding the job's stdout and stderr, in that order, where they exist."""
        ...


def warm(backend: Backend) -> None:
    """Call the backend's optional ``warm()`` hook, if it has one (exceptions propagate)."""
    hook = getattr(backend, "warm", None)
    if callable(hook):
        hook()


def job_env(req: LaunchRequest, checkpoint_dir: str) -> dict[str, str]:
    """The environment every backend gives a job: the checkpoint protocol of the design, the
    submitted environment, then the scheduler's per-attempt variables (``req.env``: the
    attempt's MLflow run among them), which win: a requeued attempt logs to its own run even
    when the submit named one."""
    env = {
        "MLOPS_GPU_RUN_ID": req.run_id,
        "MLOPS_GPU_ATTEMPT": str(req.attempt),
        "MLOPS_GPU_CHECKPOINT_DIR": checkpoint_dir,
        "MLOPS_GPU_PROJECT": req.spec.project,
        "MLOPS_GPU_GPU_TYPE": req.placement.gpu_type,
    }
    env.update(req.spec.env)
    env.update(req.env)
    return env
