"""The ``mlops-gpu`` Prefect worker: a flow run from an ``mlops-gpu`` work pool becomes a
scheduled run, so Prefect's runs queue for GPUs under mlops-gpu's quotas, priorities and
fair share (Prefect's own limits count runs, not GPUs).

``run()``: the flow run's command (``prefect flow-run execute``, with the environment Prefect
prepared) is submitted to the scheduler with the job variables (``project``, ``gpus``,
``gpu_type``, ``priority``, ``max_runtime``, ``nodes``, ``backend``, ``experiment``,
``config``, ``cpu``, ``memory``; ``gpus: 0`` is a CPU-only run, of one core unless ``cpu`` or
``memory`` says otherwise); the scheduled run's id is the infrastructure id
(``task_status.started``). While it waits, the flow run stays Pending with the scheduler's
reason as its state message ("waiting for GPUs: ..."); once it runs, a Markdown artifact links
the flow run to the attempt's MLflow run. ``run()`` returns when the scheduled run ends, with
its exit code.
``kill_infrastructure()`` cancels the scheduled run (Prefect's cancel); the waiting ``run()``
also cancels it as soon as it sees the flow run Cancelling, since the flow's own process may
notice the cancel and exit first.

Remote mode: with ``MLOPS_GPU_URL`` (or ``mlops-gpu login`` credentials) in the worker's
environment, the worker talks to that ``mlops-gpu server`` through the SDK (``sdk.remote``)
and never opens the store; the runs are the token's identity's, ``config`` is not used, and
the flow runs on the server's backends (so the flow's code must be reachable from there, as a
deployment's source always must be for its worker). Exit codes are not served: a failed run
ends with status code 1.

Invariants: one scheduled run per flow run submission; the worker never runs the flow itself.
Store and server calls run in threads (``anyio.to_thread``), never on Prefect's event loop.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import anyio
from prefect.client.schemas.objects import FlowRun
from prefect.workers.base import (
    BaseJobConfiguration,
    BaseVariables,
    BaseWorker,
    BaseWorkerResult,
)
from pydantic import BaseModel, Field

from mlops_gpu.model import TERMINAL_PHASES, Phase

#: How often the worker looks at the scheduled run it waits for.
POLL_S = 1.0

_DESCRIPTIONS = {
    "project": "mlops-gpu project whose GPU quota the flow run uses.",
    "gpus": "GPUs per node (0 for a CPU-only run).",
    "gpu_type": "GPU type, or a comma-separated list of acceptable types (default: any).",
    "priority": "Priority class (default: the config's default class).",
    "max_runtime": "Seconds after which the run is stopped (with its checkpoint signal).",
    "nodes": "Nodes of a multi-node gang (all at once or nothing).",
    "backend": "Pin the run to one backend of the mlops-gpu config (default: any).",
    "experiment": "MLflow experiment for the run (default: one named after the project).",
    "config": "Path of the mlops-gpu config on the worker's host (default: the usual lookup).",
    "cpu": "Host CPU per node in millicores (4000 = 4 cores); with gpus 0 the default is 1000.",
    "memory": "Host memory per node in MB.",
}

#: The CPU of a CPU-only run (``gpus: 0``) that names neither ``cpu`` nor ``memory``: one core.
DEFAULT_CPU_ONLY_MILLI = 1000


class GpuRequestFields(BaseModel):
    """The GPU request of a flow run: both the work pool's variables (with the descriptions its
    form shows) and the job configuration they fill."""

    project: str = Field(description=_DESCRIPTIONS["project"])
    gpus: int = Field(default=1, ge=0, description=_DESCRIPTIONS["gpus"])
    gpu_type: str | None = Field(default=None, description=_DESCRIPTIONS["gpu_type"])
    priority: str | None = Field(default=None, description=_DESCRIPTIONS["priority"])
    max_runtime: float | None = Field(default=None, gt=0, description=_DESCRIPTIONS["max_runtime"])
    nodes: int = Field(default=1, ge=1, description=_DESCRIPTIONS["nodes"])
    backend: str | None = Field(default=None, description=_DESCRIPTIONS["backend"])
    experiment: str | None = Field(default=None, description=_DESCRIPTIONS["experiment"])
    config: str | None = Field(default=None, description=_DESCRIPTIONS["config"])
    cpu: int = Field(default=0, ge=0, description=_DESCRIPTIONS["cpu"])
    memory: int = Field(default=0, ge=0, description=_DESCRIPTIONS["memory"])


class MlopsGpuJobConfiguration(GpuRequestFields, BaseJobConfiguration):
    """What ``run()`` gets: Prefect's command, environment and name, and the GPU request."""


class MlopsGpuVariables(GpuRequestFields, BaseVariables):
    """The work pool's job variables."""


class MlopsGpuWorkerResult(BaseWorkerResult):
    """``identifier`` is the scheduled run's id; ``status_code`` its exit code (0: success)."""


def _argv(configuration: MlopsGpuJobConfiguration) -> list[str]:
    command = configuration.command or "prefect flow-run execute"
    argv = shlex.split(command)
    if argv[:1] == ["prefect"]:  # this interpreter's Prefect, whatever the job's PATH says
        argv = [sys.executable, "-m", "prefect", *argv[1:]]
    return argv


def submit_keywords(
    configuration: MlopsGpuJobConfiguration, flow_run_name: str
) -> tuple[list[str], dict[str, Any]]:
    """The flow run as ``mg.submit``'s command and keywords, so it is built by the one builder
    the CLI and the SDK use (``sdk.run.submit_request``, ``model.submit``)."""
    from mlops_gpu.sdk.run import remote_target

    env = {k: v for k, v in configuration.env.items() if v is not None}
    gpu_types = [t.strip() for t in (configuration.gpu_type or "").split(",") if t.strip()]
    cpu = configuration.cpu
    if configuration.gpus == 0 and cpu == 0 and configuration.memory == 0:
        cpu = DEFAULT_CPU_ONLY_MILLI  # a CPU-only run must ask for something of the host
    return _argv(configuration), {
        "project": configuration.project,
        "gpus": configuration.gpus,
        "nodes": configuration.nodes,
        "gpu_type": gpu_types or None,
        "priority": configuration.priority,
        "name": configuration.name or f"prefect:{flow_run_name}",
        "max_runtime": configuration.max_runtime,
        "experiment": configuration.experiment,
        "env": env,
        # a server runs it in the backend's folder: this host's folders are not the server's
        "workdir": None if remote_target(configuration.config) else os.getcwd(),
        "backend": configuration.backend,
        "config": configuration.config,
        "cpu_milli": cpu,
        "host_memory_mb": configuration.memory,
    }


def _submit(flow_run: FlowRun, configuration: MlopsGpuJobConfiguration) -> Any:
    import mlops_gpu as mg

    argv, keywords = submit_keywords(configuration, flow_run.name)
    return mg.submit(argv, **keywords)


class MlopsGpuWorker(BaseWorker[MlopsGpuJobConfiguration, MlopsGpuVariables, MlopsGpuWorkerResult]):
    type = "mlops-gpu"
    job_configuration = MlopsGpuJobConfiguration
    job_configuration_variables = MlopsGpuVariables
    _description = (
        "Run flows as GPU runs of the mlops-gpu scheduler: queued by project quota, priority "
        "and fair share, placed on local, Slurm or Kubernetes GPUs, tracked in MLflow."
    )
    _display_name = "mlops-gpu"

    async def run(
        self,
        flow_run: FlowRun,
        configuration: MlopsGpuJobConfiguration,
        task_status: anyio.abc.TaskStatus[Any] | None = None,  # (Prefect types it int; ids are str)
    ) -> MlopsGpuWorkerResult:
        logger = self.get_flow_run_logger(flow_run)
        run = await anyio.to_thread.run_sync(_submit, flow_run, configuration)
        logger.info(f"Queued as mlops-gpu run {run.id} in project {configuration.project}")
        if task_status is not None:
            task_status.started(run.id)
        said: str | None = None
        linked = cancelled = False
        while True:
            record = await anyio.to_thread.run_sync(lambda: run.record)
            phase = record.phase
            # Prefect's cancel: the flow's own process may notice it and exit first, so the
            # worker does not wait for its cancellation observer to cancel the run
            ended = phase in TERMINAL_PHASES
            if not cancelled and not ended and await self._cancelling(flow_run):
                cancelled = True
                await anyio.to_thread.run_sync(run.cancel)
                logger.info(f"flow run cancelled: cancelling mlops-gpu run {run.id}")
            if phase is Phase.PENDING and record.reason and record.reason != said:
                said = record.reason
                await self._say_waiting(flow_run, f"waiting for GPUs: {said}")
                logger.info(f"mlops-gpu run {run.id} waits: {said}")
            if not linked and phase in (Phase.STARTING, Phase.RUNNING):
                linked = await self._link_mlflow(flow_run, run)
            if ended:
                logger.info(f"mlops-gpu run {run.id} {phase.value}: {record.reason or ''}")
                if cancelled or phase is Phase.CANCELLED:
                    # the job was stopped before its flow could say so itself
                    await self._mark_flow_run_as_cancelled(
                        flow_run, {"message": f"mlops-gpu run {run.id} cancelled"}
                    )
                    return MlopsGpuWorkerResult(identifier=run.id, status_code=0)
                code = record.exit_code
                if code is None:
                    code = 0 if phase is Phase.SUCCEEDED else 1
                return MlopsGpuWorkerResult(identifier=run.id, status_code=code)
            await anyio.sleep(POLL_S)

    async def _cancelling(self, flow_run: FlowRun) -> bool:
        from prefect.client.orchestration import get_client

        try:
            async with get_client() as client:
                state = (await client.read_flow_run(flow_run.id)).state
        except Exception:
            return False
        return state is not None and (state.is_cancelling() or state.is_cancelled())

    async def _say_waiting(self, flow_run: FlowRun, message: str) -> None:
        """The flow run stays Pending, with the scheduler's reason as its message."""
        from prefect.client.orchestration import get_client
        from prefect.states import Pending

        try:
            async with get_client() as client:
                current = await client.read_flow_run(flow_run.id)
                if current.state is not None and current.state.is_pending():
                    await client.set_flow_run_state(flow_run.id, Pending(message=message),
                                                    force=True)  # fmt: skip
        except Exception as e:  # a message is not worth failing the run for
            self._logger.debug("could not update the flow run's message: %s", e)

    async def _link_mlflow(self, flow_run: FlowRun, run: Any) -> bool:
        """A Markdown artifact on the flow run naming (and, on a server, linking) its MLflow
        run. Returns whether there was one to link yet."""
        mlflow_id = await anyio.to_thread.run_sync(lambda: run.mlflow_run_id)
        if mlflow_id is None:
            return False
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactCreate

        uri = await anyio.to_thread.run_sync(run.tracking_uri)
        if uri is None:
            return True
        text = f"MLflow run `{mlflow_id}` (tracking URI `{uri}`)"
        if uri.startswith(("http://", "https://")):
            text = f"[MLflow run {mlflow_id}]({uri.rstrip('/')}/#/runs/{mlflow_id})"
        try:
            async with get_client() as client:
                await client.create_artifact(
                    ArtifactCreate(
                        key=f"mlflow-run-{str(flow_run.id)[:8]}",
                        type="markdown",
                        data=text,
                        description="The flow run's MLflow run",
                        flow_run_id=flow_run.id,
                    )
                )
        except Exception as e:
            self._logger.debug("could not link the MLflow run: %s", e)
        return True

    async def kill_infrastructure(
        self,
        infrastructure_pid: str,
        configuration: MlopsGpuJobConfiguration,
        grace_seconds: int = 30,
    ) -> None:
        """Cancel the scheduled run (its checkpoint signal, then a kill after its grace)."""
        from prefect.exceptions import InfrastructureNotFound

        import mlops_gpu as mg

        def cancel() -> None:
            try:
                mg.get_run(infrastructure_pid, config=configuration.config).cancel()
            except KeyError:
                raise InfrastructureNotFound(f"mlops-gpu has no run {infrastructure_pid}") from None

        await anyio.to_thread.run_sync(cancel)
