"""``mlflow.project_backend`` ``mlops-gpu``: ``mlflow run . --backend mlops-gpu --backend-config
'{"project": "vision", "gpus": 2}'`` queues the project's entry point as a scheduled run.

The backend fetches and validates the project as MLflow's own local backend does, creates the
MLflow run (with MLflow's project tags and parameters), and submits the entry point's command
(run by ``bash -c`` in the project directory, in the current Python environment: the
``local`` env manager) through the SDK, which starts the embedded scheduler when none runs.
``mlflow run`` returns once the run is queued (MLflow's CLI waits only for its own local and
kubernetes backends); ``mlflow.projects.run(..., synchronous=True)`` waits for the scheduled run
to end. The MLflow run is made in the scheduler's tracking store (its config's
``mlflow.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else the SQLite store in its state
folder), whatever store ``mlflow run`` itself resolved, in the experiment ``mlflow run`` named
(``--experiment-name``/``--experiment-id``, by name), else the one named after the mlops-gpu
project, where the scheduler puts the project's runs. The calling process's MLflow tracking
URI is set to the scheduler's (MLflow tags the run after the backend returns, through it).
The scheduler adopts that MLflow run for
the first attempt
(``MLOPS_GPU_MLFLOW_RUN_ID``): its tags, GPU metrics, queue wait and cost land in the run
``mlflow run`` prints; a requeued attempt gets its own MLflow run, linked by
``mlops_gpu.run_id``.

Backend config keys (JSON): ``project`` (required), ``gpus`` (default 1), ``nodes``,
``gpu_type``, ``priority``, ``max_runtime`` (seconds), ``name``, ``backend``, ``preemptible``,
``max_attempts``, ``config`` (path of the mlops-gpu config; default: the usual lookup).
An unknown key, or a value of the wrong type, is an error naming the key.

Remote mode (``MLOPS_GPU_URL``, or ``mlops-gpu login`` credentials; as the SDK): the run is
queued on that ``mlops-gpu server`` under the token's identity, the MLflow run is made in the
server's tracking store (``GET /api/v1/settings``; it must be reachable from here, as an
``http://`` MLflow server is), ``config`` is not used, and the project's folder must be
reachable from the server's backends under the same path (a shared file system).

Invariants: the module imports mlflow's small abstract classes only; mlops_gpu's scheduler and
mlflow's project machinery are imported when a run is submitted. A run this backend submitted
that ends is closed in MLflow (FINISHED, FAILED or KILLED) by ``wait`` if the scheduler left it
open (it does not track to a tracking URI it cannot reach over REST).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mlflow.projects.backend.abstract_backend import AbstractBackend
from mlflow.projects.submitted_run import SubmittedRun

#: key -> (accepted types, what the error says is expected)
KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "project": ((str,), "a project name"),
    "gpus": ((int,), "a whole number of GPUs"),
    "nodes": ((int,), "a whole number of nodes"),
    "gpu_type": ((str, list), "a GPU type or a list of them"),
    "priority": ((str,), "a priority class"),
    "max_runtime": ((int, float), "seconds"),
    "name": ((str,), "a run name"),
    "backend": ((str,), "a backend name"),
    "preemptible": ((bool,), "true or false"),
    "max_attempts": ((int,), "a whole number"),
    "config": ((str,), "the path of an mlops-gpu config"),
}
ADOPT_ENV = "MLOPS_GPU_MLFLOW_RUN_ID"
_logger = logging.getLogger("mlflow.projects")  # MLflow's CLI shows this logger's INFO lines
#: scheduled run phase -> MLflow's run status names
STATUS = {
    "pending": "SCHEDULED",
    "admitted": "SCHEDULED",
    "starting": "SCHEDULED",
    "running": "RUNNING",
    "succeeded": "FINISHED",
    "failed": "FAILED",
    "cancelled": "KILLED",
}


def parse_backend_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The mlops-gpu keys of ``--backend-config``, checked (MLflow adds its own keys too)."""
    from mlflow.exceptions import MlflowException

    ours = {k: v for k, v in cfg.items() if k not in _MLFLOW_KEYS and not k.startswith("_mlflow")}
    for key, value in ours.items():
        if key not in KEYS:
            raise MlflowException.invalid_parameter_value(
                f"--backend-config: unknown key {key!r} for the mlops-gpu backend "
                f"(known: {', '.join(sorted(KEYS))})"
            )
        types, expected = KEYS[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise MlflowException.invalid_parameter_value(
                f"--backend-config: {key!r} must be {expected}, not {value!r}"
            )
    if "project" not in ours:
        raise MlflowException.invalid_parameter_value(
            "--backend-config: 'project' is required for the mlops-gpu backend, "
            'e.g. --backend-config \'{"project": "vision", "gpus": 2}\''
        )
    return ours


# Keys MLflow's runner puts into every backend config (``PROJECT_*`` of mlflow.projects.utils).
_MLFLOW_KEYS = {"ENV_MANAGER", "SYNCHRONOUS", "DOCKER_ARGS", "STORAGE_DIR", "build_image",
                "docker_auth"}  # fmt: skip


class ScheduledProjectRun(SubmittedRun):
    """MLflow's handle on a scheduled run: ``wait``, ``get_status``, ``cancel``, ``run_id``."""

    def __init__(self, mlflow_run_id: str, run: Any, tracking_uri: str | None = None) -> None:
        self._mlflow_run_id = mlflow_run_id
        self.run = run  # mlops_gpu.sdk.Run
        self._tracking_uri = tracking_uri  # the store the MLflow run is in

    @property
    def run_id(self) -> str:
        return self._mlflow_run_id

    def wait(self) -> bool:
        phase = self.run.wait()
        self._close(phase)
        return bool(phase == "succeeded")

    def get_status(self) -> str:
        return STATUS.get(self.run.status, "RUNNING")

    def cancel(self) -> None:
        self.run.cancel()
        self._close(self.run.wait())

    def _close(self, phase: str) -> None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self._tracking_uri)
        if client.get_run(self._mlflow_run_id).info.status in ("RUNNING", "SCHEDULED"):
            client.set_terminated(self._mlflow_run_id, STATUS.get(phase, "FAILED"))


class MlopsGpuProjectBackend(AbstractBackend):
    def run(
        self,
        project_uri: str,
        entry_point: str,
        params: dict[str, Any],
        version: str | None,
        backend_config: dict[str, Any],
        tracking_uri: str | None,
        experiment_id: str,
    ) -> ScheduledProjectRun:
        from mlflow.exceptions import MlflowException
        from mlflow.projects.utils import PROJECT_ENV_MANAGER

        env_manager = backend_config.get(PROJECT_ENV_MANAGER)
        if env_manager not in (None, "local"):
            raise MlflowException.invalid_parameter_value(
                f"the mlops-gpu backend runs projects in the current Python environment; "
                f"use --env-manager local (not {env_manager!r})"
            )
        opts = parse_backend_config(backend_config)
        store = _scheduler_store(opts, tracking_uri, experiment_id)
        if store is not None:  # MLflow's calls (here and after, its tags) and the job go there
            import mlflow

            tracking_uri, experiment_id = store
            mlflow.set_tracking_uri(tracking_uri)
        return self._run(
            project_uri, entry_point, params, version, opts, tracking_uri, experiment_id
        )

    def _run(
        self,
        project_uri: str,
        entry_point: str,
        params: dict[str, Any],
        version: str | None,
        opts: dict[str, Any],
        tracking_uri: str | None,
        experiment_id: str,
    ) -> ScheduledProjectRun:
        from mlflow.projects.utils import (
            fetch_and_validate_project,
            get_entry_point_command,
            get_or_create_run,
            get_run_env_vars,
            load_project,
        )
        from mlflow.tracking import MlflowClient

        import mlops_gpu as mg

        work_dir = fetch_and_validate_project(project_uri, version, entry_point, params)
        project = load_project(work_dir)
        active = get_or_create_run(
            None, project_uri, experiment_id, work_dir, version, entry_point, params
        )
        mlflow_id = active.info.run_id
        command = " ".join(get_entry_point_command(project, entry_point, params, None))
        env = get_run_env_vars(mlflow_id, experiment_id)
        env[ADOPT_ENV] = mlflow_id
        experiment = MlflowClient(tracking_uri).get_experiment(experiment_id).name
        try:
            run = mg.submit(
                ["bash", "-c", command],
                project=opts["project"],
                gpus=opts.get("gpus", 1),
                nodes=opts.get("nodes", 1),
                gpu_type=opts.get("gpu_type"),
                priority=opts.get("priority"),
                name=opts.get("name") or f"{project.name or 'mlflow-project'}:{entry_point}",
                max_runtime=opts.get("max_runtime"),
                experiment=experiment,
                env=env,
                workdir=work_dir,
                backend=opts.get("backend"),
                preemptible=opts.get("preemptible", True),
                max_attempts=opts.get("max_attempts"),
                config=opts.get("config"),
            )
        except Exception:
            MlflowClient(tracking_uri).set_terminated(mlflow_id, "FAILED", int(time.time() * 1000))
            raise
        MlflowClient(tracking_uri).set_tag(mlflow_id, "mlops_gpu.run_id", run.id)
        _logger.info(
            "=== Queued as mlops-gpu run %s in project %s (MLflow run %s); "
            "follow it with: mlops-gpu status %s ===",
            run.id, opts["project"], mlflow_id, run.id,
        )  # fmt: skip
        return ScheduledProjectRun(mlflow_id, run, tracking_uri)


def _scheduler_store(
    opts: dict[str, Any], tracking_uri: str | None, experiment_id: str
) -> tuple[str, str] | None:
    """(the scheduler's tracking URI, the id of the run's experiment there), or None when the
    scheduler tracks nothing (``mlflow.enabled: false``). The experiment: the one ``mlflow run``
    resolved (``experiment_id``, in ``tracking_uri``), found or created by name, unless that is
    MLflow's default (id 0: none was named), then the one named after the project."""
    import os

    from mlflow.tracking import MlflowClient

    from mlops_gpu.config import load_config
    from mlops_gpu.sdk.run import remote_target
    from mlops_gpu.tracking.fields import experiment_artifacts

    if (target := remote_target(opts.get("config"))) is not None:
        from mlops_gpu.sdk.remote import client as remote_client

        settings = remote_client(target).settings()  # the server's MLflow: its config is not here
        if not settings["mlflow_enabled"]:
            return None
        uri, root = str(settings["tracking_uri"]), settings["artifact_root"]
    else:
        cfg = load_config(opts.get("config"))
        if not cfg.mlflow.enabled:
            return None
        uri = cfg.tracking_uri(dict(os.environ))
        root = cfg.artifact_root(uri)
    name = opts["project"]
    if str(experiment_id) != "0":
        name = MlflowClient(tracking_uri).get_experiment(experiment_id).name
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return uri, str(exp.experiment_id)
    where = experiment_artifacts(root, name)
    return uri, str(client.create_experiment(name, artifact_location=where))
