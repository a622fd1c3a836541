"""MLflow runs for scheduled runs, over REST, when the tracking URI is an MLflow server.

One MLflow run per attempt, in the submit's experiment (``experiment=``) or one named after the
project, linked by the tag ``mlops_gpu.run_id``. Tags: ``mlops_gpu.run_id``, ``.project``,
``.user``, ``.priority``, ``.backend``, ``.nodes``, ``.gpu_type``, ``.gpu_uuids`` (the devices
held), ``.attempt``. The job gets ``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID`` and
``MLFLOW_EXPERIMENT_ID``, so ``mlops-gpu exec`` and the user's own ``mlflow`` calls log into
that run. When the attempt ends: ``mlops_gpu.queue_wait_s`` (admission minus the time the attempt
joined the queue: the submit, or for a requeued attempt its requeue), ``mlops_gpu.gpu_hours`` and
``mlops_gpu.cost_usd`` (GPU-hours, shares by their share, times the type's price), for a
preempted attempt ``mlops_gpu.lost_gpu_s`` (the work its preemption threw away: GPU-seconds
since its last checkpoint, else its start), the tag ``mlops_gpu.outcome``, and the run's
status (FINISHED, FAILED, or KILLED for cancelled and preempted attempts).

Invariants:
- Tracking never stops scheduling: an MLflow failure is logged (once per message), the run goes
  on untracked, and tracking pauses for ``PAUSE_S`` (a server that does not answer would
  otherwise cost a timeout per run).
- The controller queues an attempt's close at the end of the tick that saw it end, and the
  tracking worker makes it (``tracking_queue``: off the tick's path, recovered from the store
  after a stop), so MLflow may show it running a moment after the store says it ended.
- A close is two writes: one log-batch (the metrics and the outcome tag), then the status.
- An attempt's MLflow run is remembered in memory and, after a restart, found again by its tags.
  A scheduler that stopped between making an attempt's MLflow run and launching its job left a
  run that no job writes to: the next start finds it (``find_attempt``) and closes it FAILED
  (``launch_failed``) when it rolls the admission back, so no MLflow run stays RUNNING forever.
- The first attempt adopts the MLflow run named by ``MLOPS_GPU_MLFLOW_RUN_ID`` in the submitted
  environment, if any (tags set on it, never a second run); later attempts get their own. A
  launch of it that fails and will be tried again leaves that run open: the retry adopts it.
  ``MLOPS_GPU_MLFLOW_PARENT_RUN_ID`` nests every attempt's run under that run (sweeps).
- A file or database tracking URI (the local SQLite default) is written through the ``mlflow``
  package in the scheduler process (``mlflow_local``); jobs get the same URI, so their own
  ``mlflow`` calls land in the attempt's run. The launcher logs GPU samples only to a server
  (REST); with a local store the scheduler logs the launcher's ``mean_gpu_utilization``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from mlops_gpu.controller.mlflow_local import MlflowLocal
from mlops_gpu.model import GpuType, Run
from mlops_gpu.state.mlflow_notes import UnclosedMlflowRun
from mlops_gpu.telemetry.mlflow_rest import MlflowRest, TrackingError, rest_uri

log = logging.getLogger("mlops_gpu.tracking")

PAUSE_S = 60.0
#: In a run's submitted environment: an MLflow run the submitter created (``mlflow run`` with
#: the ``mlops-gpu`` project backend), adopted as the first attempt's run instead of a new one.
ADOPT_ENV = "MLOPS_GPU_MLFLOW_RUN_ID"
#: In a run's submitted environment: the MLflow run its attempts' runs nest under (a sweep's
#: parent run), as MLflow's ``mlflow.parentRunId`` tag.
PARENT_ENV = "MLOPS_GPU_MLFLOW_PARENT_RUN_ID"

STATUS = {
    "succeeded": "FINISHED",
    "failed": "FAILED",
    "lost": "FAILED",
    "launch_failed": "FAILED",
    "cancelled": "KILLED",
    "preempted": "KILLED",
}


class Tracker:
    def __init__(self, uri: str | None, gpu_types: Mapping[str, GpuType]) -> None:
        base = rest_uri(uri)
        self.uri = base or uri or None
        self.rest: MlflowRest | MlflowLocal | None = None
        if base:
            self.rest = MlflowRest(base)
        elif self.uri:  # a file or database store: through the mlflow package, here only
            self.rest = MlflowLocal(self.uri)
        #: the job's launcher cannot log to a local store: the summary comes through us
        self.logs_summary = isinstance(self.rest, MlflowLocal)
        self.gpu_types = gpu_types
        self._ids: dict[tuple[str, int], str] = {}
        self._experiments: dict[str, str] = {}
        self._said: set[str] = set()
        self._paused_until = float("-inf")

    @property
    def active(self) -> bool:
        return self.rest is not None and time.monotonic() >= self._paused_until

    def _fail(self, e: TrackingError) -> None:
        self._paused_until = time.monotonic() + PAUSE_S
        msg = str(e)
        if msg not in self._said:
            self._said.add(msg)
            log.warning("MLflow tracking: %s (runs go on untracked for %.0f s)", msg, PAUSE_S)

    def _experiment(self, run: Run) -> str:
        name = run.spec.experiment or run.project
        if name not in self._experiments:
            assert self.rest is not None
            self._experiments[name] = self.rest.experiment_id(name)
        return self._experiments[name]

    def prepare(self, run: Run) -> None:
        """Resolve the run's experiment now (launches may then run in threads)."""
        if not self.active or self.rest is None:
            return
        if self.adopts(run):
            return
        try:
            self._experiment(run)
        except TrackingError as e:
            self._fail(e)

    def started(self, run: Run) -> dict[str, str]:
        """Create the attempt's MLflow run; the environment its job should get."""
        if not self.active or self.rest is None or run.placement is None:
            return {}
        p = run.placement
        tags = {
            "mlops_gpu.run_id": run.id,
            "mlops_gpu.project": run.project,
            "mlops_gpu.user": run.spec.user,
            "mlops_gpu.priority": run.spec.priority,
            "mlops_gpu.backend": p.backend,
            "mlops_gpu.nodes": ",".join(p.node_names),
            "mlops_gpu.gpu_type": p.gpu_type,
            "mlops_gpu.gpu_uuids": ",".join(d for s in p.slots for d in s.devices),
            "mlops_gpu.attempt": str(run.attempt),
        }
        if run.spec.env.get(PARENT_ENV):
            tags["mlflow.parentRunId"] = run.spec.env[PARENT_ENV]
        adopt = run.spec.env[ADOPT_ENV] if self.adopts(run) else None
        try:
            if adopt:  # the submitter made the first attempt's MLflow run (mlflow run)
                self.rest.set_tags(adopt, tags)
                mlflow_id, exp = adopt, None
            else:
                exp = self._experiment(run)
                mlflow_id = self.rest.create_run(exp, f"{run.spec.name} #{run.attempt}", tags)
        except TrackingError as e:
            self._fail(e)
            return {}
        self._ids[(run.id, run.attempt)] = mlflow_id
        assert self.uri is not None
        env = {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_RUN_ID": mlflow_id}
        if exp is not None:
            env["MLFLOW_EXPERIMENT_ID"] = exp
        return env

    def adopts(self, run: Run) -> bool:
        """Whether the run's current attempt logs into the submitter's MLflow run."""
        return run.attempt == 1 and bool(run.spec.env.get(ADOPT_ENV))

    def find_attempt(self, run: Run) -> str | None:
        """The MLflow run ``started`` made for the run's current attempt, found by its tags (a
        scheduler that stopped between making it and noting it in the store), or None. Never
        the submitter's run that the first attempt adopts: that one is the submitter's, and the
        attempt's next launch adopts it again."""
        if not self.active or self.rest is None or self.adopts(run):
            return None
        try:
            return self.rest.find_run(
                self._experiment(run),
                {"mlops_gpu.run_id": run.id, "mlops_gpu.attempt": str(run.attempt)},
            )
        except TrackingError as e:
            self._fail(e)
            return None

    def forget(self, run: Run) -> None:
        """The attempt's launch failed: its next launch (same attempt) gets a new MLflow run."""
        self._ids.pop((run.id, run.attempt), None)

    def ended(
        self,
        run: Run,
        outcome: str,
        end: float,
        mean_utilization: float | None = None,
        mlflow_id: str | None = None,
        lost_gpu_s: float | None = None,
    ) -> str | None:
        """Log the attempt's queue wait, GPU-hours and cost, and close its MLflow run
        (``mlflow_id`` if given, else the one ``started`` created or adopted, else the one its
        tags name); the id of the MLflow run closed, or None. ``mean_utilization``: the
        launcher's, logged here when the launcher could not."""
        if not self.active or self.rest is None or run.placement is None:
            return None
        if run.admitted_at is None:
            return None
        try:
            mlflow_id = mlflow_id or self._ids.pop((run.id, run.attempt), None)
            if mlflow_id is None and self.adopts(run):  # (maybe in another experiment)
                mlflow_id = run.spec.env[ADOPT_ENV]
            mlflow_id = mlflow_id or self.rest.find_run(
                self._experiment(run),
                {"mlops_gpu.run_id": run.id, "mlops_gpu.attempt": str(run.attempt)},
            )
            if mlflow_id is None:
                return None  # started before tracking was configured
            p = run.placement
            hours = p.gpu_amount * max(end - run.admitted_at, 0.0) / 3600
            self._close(mlflow_id, outcome, end, hours, p.gpu_type, run.queue_wait_s or 0.0,
                        mean_utilization, lost_gpu_s)  # fmt: skip
        except TrackingError as e:
            self._fail(e)
            return None
        return mlflow_id

    def close_recovered(self, u: UnclosedMlflowRun) -> bool:
        """Close an attempt's MLflow run from the store's record (``TrackingQueue.recover``):
        the usage ledger's figures, or, for an attempt that never held GPUs, FAILED as
        ``launch_failed``. False if MLflow did not take it."""
        if not self.active or self.rest is None:
            return False
        try:
            if u.outcome is None:
                self.rest.log_batch(u.mlflow_run_id, [], {"mlops_gpu.outcome": "launch_failed"})
                self.rest.finish(u.mlflow_run_id, "FAILED", None)
            else:
                wait = None if u.queued_at is None else max(u.start - u.queued_at, 0.0)
                self._close(u.mlflow_run_id, u.outcome, u.end, u.gpu_seconds / 3600,
                            u.gpu_type, wait, u.mean_util, u.lost_gpu_s)  # fmt: skip
        except TrackingError as e:
            self._fail(e)
            return False
        return True

    def _close(
        self,
        mlflow_id: str,
        outcome: str,
        end: float,
        hours: float,
        gpu_type: str,
        queue_wait_s: float | None,
        mean_utilization: float | None,
        lost_gpu_s: float | None = None,
    ) -> None:
        """Two writes: the metrics with the outcome tag (one log-batch), then the status."""
        price = self.gpu_types[gpu_type].price_per_hour if gpu_type in self.gpu_types else 0
        metrics = [
            ("mlops_gpu.gpu_hours", hours, end, 0),
            ("mlops_gpu.cost_usd", hours * price, end, 0),
        ]
        if queue_wait_s is not None:
            metrics.insert(0, ("mlops_gpu.queue_wait_s", queue_wait_s, end, 0))
        if self.logs_summary and mean_utilization is not None:
            metrics.append(("mlops_gpu.mean_gpu_utilization", mean_utilization, end, 0))
        if lost_gpu_s is not None:  # (a preempted attempt)
            metrics.append(("mlops_gpu.lost_gpu_s", round(lost_gpu_s, 1), end, 0))
        assert self.rest is not None
        self.rest.log_batch(mlflow_id, metrics, {"mlops_gpu.outcome": outcome})
        self.rest.finish(mlflow_id, STATUS.get(outcome, "FAILED"), end)
