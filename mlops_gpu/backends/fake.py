"""The ``fake`` backend: jobs that exist only in memory, for tests and the simulator.

A job runs for ``duration_s`` on the backend's clock (``spec.env["FAKE_DURATION_S"]`` or the
default) and then succeeds, unless a test ends, loses or fails it first. ``fail_launches`` makes
the next launches raise ``LaunchError``. Handles: ``fake:<backend>:<run_id>:<attempt>``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlops_gpu.backends.base import (
    HandleError,
    JobState,
    JobStatus,
    JobTelemetry,
    LaunchError,
    LaunchRequest,
)
from mlops_gpu.model import BackendCapabilities, Node


@dataclass
class FakeJob:
    req: LaunchRequest
    started_at: float
    duration_s: float
    state: JobState = JobState.RUNNING
    exit_code: int | None = None
    finished_at: float | None = None
    reason: str = ""
    signals: int = 0
    #: What a launcher would have measured (tests set it).
    telemetry: JobTelemetry | None = None


class FakeBackend:
    kind = "fake"

    def __init__(
        self,
        name: str,
        nodes: Sequence[Node],
        *,
        default_duration_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        multi_node: bool = True,
    ) -> None:
        self.name = name
        self.nodes = list(nodes)
        self.clock = clock
        self.default_duration_s = default_duration_s
        self.capabilities = BackendCapabilities(multi_node=multi_node)
        self.jobs: dict[str, FakeJob] = {}
        self.fail_launches = 0
        self.launch_count = 0

    def inventory(self) -> list[Node]:
        return list(self.nodes)

    def launch(self, req: LaunchRequest) -> str:
        if self.fail_launches > 0:
            self.fail_launches -= 1
            raise LaunchError("fake launch failure")
        handle = f"fake:{self.name}:{req.run_id}:{req.attempt}"
        if handle in self.jobs:
            raise LaunchError(f"{handle} launched twice")
        duration = float(req.spec.env.get("FAKE_DURATION_S", self.default_duration_s))
        self.jobs[handle] = FakeJob(req, self.clock(), duration)
        self.launch_count += 1
        return handle

    def _settle(self, job: FakeJob) -> None:
        now = self.clock()
        if job.state is JobState.RUNNING and now >= job.started_at + job.duration_s:
            job.state, job.exit_code = JobState.SUCCEEDED, 0
            job.finished_at, job.reason = job.started_at + job.duration_s, "exited"

    def poll(self, handles: Sequence[str]) -> dict[str, JobStatus]:
        out = {}
        for h in handles:
            job = self.jobs.get(h)
            if job is None:
                out[h] = JobStatus(h, JobState.LOST, reason="no such fake job")
                continue
            self._settle(job)
            out[h] = JobStatus(
                h, job.state, job.exit_code, job.started_at, job.finished_at, job.reason,
                job.telemetry,
            )  # fmt: skip
        return out

    def cancel(self, handle: str, signal: str, grace_s: float) -> None:
        job = self.jobs.get(handle)
        if job is None:
            raise HandleError(f"{handle!r} is not a job of fake backend {self.name}")
        job.signals += 1
        if job.state is JobState.RUNNING:
            job.state, job.exit_code, job.reason = JobState.FAILED, -15, "stopped"
            job.finished_at = self.clock()

    def find(self, run_id: str, attempt: int) -> str | None:
        h = f"fake:{self.name}:{run_id}:{attempt}"
        return h if h in self.jobs else None

    def log_files(self, run_id: str, attempt: int) -> list[Path]:
        return []

    # -- test controls ----------------------------------------------------------------------
    def end(self, handle: str, exit_code: int = 0) -> None:
        job = self.jobs[handle]
        job.state = JobState.SUCCEEDED if exit_code == 0 else JobState.FAILED
        job.exit_code, job.finished_at, job.reason = exit_code, self.clock(), "exited"

    def lose(self, handle: str) -> None:
        del self.jobs[handle]
