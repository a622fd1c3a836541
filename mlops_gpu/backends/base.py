"""The backend interface every placement target implements (in the manner of submitit's small
executor hooks and SkyPilot's capability flags)."""

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
class JobStatus:
    handle: str
    state: JobState
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    #: Why it ended: "exited", "max_runtime", "stopped" (cancel or preempt), or a backend message.
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    run_id: str
    attempt: int
    spec: RunSpec
    placement: Placement
    #: Extra environment for the job (MLOPS_GPU_RUN_ID, MLOPS_GPU_ATTEMPT, ...).
    env: Mapping[str, str] = field(default_factory=dict)


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


def job_env(req: LaunchRequest, checkpoint_dir: str) -> dict[str, str]:
    """The environment every backend gives a job: the checkpoint protocol of the design."""
    env = {
        "MLOPS_GPU_RUN_ID": req.run_id,
        "MLOPS_GPU_ATTEMPT": str(req.attempt),
        "MLOPS_GPU_CHECKPOINT_DIR": checkpoint_dir,
        "MLOPS_GPU_PROJECT": req.spec.project,
        "MLOPS_GPU_GPU_TYPE": req.placement.gpu_type,
    }
    env.update(req.env)
    env.update(req.spec.env)
    return env
