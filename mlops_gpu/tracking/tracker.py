"""MLflow runs for scheduled runs: over REST when the tracking URI is an MLflow server, else
through the mlflow package (``tracking.local``: the local SQLite default).

One MLflow run per attempt, in the submit's experiment (``experiment=``) or one named after the
project, linked by the tag ``mlops_gpu.run_id``. Tags: ``mlops_gpu.run_id``, ``.project``,
``.user``, ``.priority``, ``.backend``, ``.nodes``, ``.gpu_type``, ``.gpu_uuids`` (the devices
held), ``.attempt``, and MLflow's ``mlflow.user`` (the submitting user: the UI's "Created by"
and "User"). Params (``tracking.fields``): the request: ``gpus``, ``nodes``, ``gpu_type``,
``priority``, ``max_runtime``, ``command``. Experiments the tracker creates get their artifacts
under the configured ``mlflow.artifact_root``, else (local stores) ``<state_dir>/mlartifacts``.
The job gets ``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID`` and ``MLFLOW_EXPERIMENT_ID``, so
``mlops-gpu exec`` and the user's own ``mlflow`` calls log into that run. When the attempt
ends: ``mlops_gpu.queue_wait_s`` (admission minus the time the attempt joined the queue: the
submit, or for a requeued attempt its requeue), ``mlops_gpu.gpu_hours`` and
``mlops_gpu.cost_usd`` (GPU-hours, shares by their share, times the type's price), for a
preempted attempt ``mlops_gpu.lost_gpu_s`` (the work its preemption threw away: GPU-seconds since
its last checkpoint, else its start), rounded (``fields.ROUND``), the tag
``mlops_gpu.outcome``, and the run's status (FINISHED,
FAILED, or KILLED for cancelled and preempted attempts).

Invariants:
- Tracking never holds scheduling: every MLflow call runs on one thread (``tracking.thread``);
  a launch waits ``LAUNCH_WAIT_S`` at most for its MLflow run, and not at all while that
  thread is behind or MLflow is away. A run launched before its MLflow run exists starts
  without ``MLFLOW_RUN_ID``; the MLflow run is still made and closed: after the launch, or,
  if MLflow is away until then, when the attempt is closed (``ended``). Nothing is lost to a
  stop meanwhile: such a launch notes its MLflow run without an id (``MlflowNote`` opened,
  None), given its id once the run is made (``made``); one left without is made and closed
  by the next start's recovery (``close_recovered``), from the store's records.
- MLflow away (``TrackingUnavailable``: unreachable, no answer, a store that cannot be
  opened) stops calls for a back-off (``BACKOFF_S``, doubling to ``PAUSE_S``), logged once per
  message; an error about one run (MLflow answered: not found, invalid) concerns that run only.
  An adopted run that MLflow does not know (made in another store) is replaced by a new run.
- The controller queues an attempt's close at the end of the tick that saw it end, and the
  tracking worker makes it (``close_queue``: off the tick's path, recovered from the store
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
  package in the scheduler process (``tracking.local``); jobs get the same URI, so their own
  ``mlflow`` calls land in the attempt's run. The launcher logs GPU samples only to a server
  (REST); with a local store the scheduler logs the launcher's ``mean_gpu_utilization``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from mlops_gpu.model import GpuType, Run
from mlops_gpu.state.mlflow_notes import MlflowNote, UnclosedMlflowRun
from mlops_gpu.tracking import fields as tracking_fields
from mlops_gpu.tracking.local import MlflowLocal
from mlops_gpu.tracking.rest import (
    MlflowRest,
    TrackingError,
    TrackingUnavailable,
    rest_uri,
)
from mlops_gpu.tracking.thread import MlflowThread

log = logging.getLogger("mlops_gpu.tracking")

#: Longest back-off after MLflow was found away (the first is ``BACKOFF_S``, then doubled).
PAUSE_S = 60.0
BACKOFF_S = 5.0
#: The longest a launch waits for its MLflow run (then it starts without; the run is made).
LAUNCH_WAIT_S = 1.5
#: The longest the tracking worker waits for one close (it is off the tick's path).
CLOSE_WAIT_S = 30.0
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
    def __init__(
        self,
        uri: str | None,
        gpu_types: Mapping[str, GpuType],
        artifact_root: str | None = None,
    ) -> None:
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
        #: where experiments the tracker creates keep their artifacts (None: MLflow's default)
        self.artifact_root = artifact_root
        #: writes notes of attempts' MLflow runs to the store (``TrackingQueue`` sets it)
        self.note: Callable[[list[MlflowNote]], None] | None = None
        self._ids: dict[tuple[str, int], str] = {}
        self._experiments: dict[str, str] = {}
        self._said: set[str] = set()
        self._paused_until = float("-inf")
        self._backoff = 0.0
        self._thread = MlflowThread()

    # -- availability -----------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Tracking configured and MLflow not known to be away."""
        return self.rest is not None and time.monotonic() >= self._paused_until

    @property
    def down(self) -> bool:
        return self.rest is not None and time.monotonic() < self._paused_until

    @property
    def opening(self) -> bool:
        """A local store not opened yet (its first opening takes seconds: an import of mlflow,
        a new store's migrations)."""
        return isinstance(self.rest, MlflowLocal) and not self.rest.opened

    @property
    def stuck(self) -> bool:
        """The MLflow thread has a call older than a launch's wait, not the store's first
        opening: MLflow does not answer."""
        return self._thread.backlog_s() > LAUNCH_WAIT_S and not self.opening

    def retry_in(self) -> float:
        """Seconds until MLflow is tried again (0: now)."""
        return max(self._paused_until - time.monotonic(), 0.0)

    def _say(self, msg: str) -> None:
        if msg not in self._said:
            self._said.add(msg)
            log.warning("MLflow tracking: %s", msg)

    def _guard(self, what: Callable[[], Any]) -> Callable[[], Any]:
        """``what`` as run on the MLflow thread: skipped while MLflow is away; its failure
        starts (or lengthens) the back-off when MLflow is away, else concerns this call only."""

        def call() -> Any:
            if self.down:
                raise TrackingUnavailable("MLflow is away (backing off)")
            try:
                out = what()
            except TrackingUnavailable as e:
                self._backoff = min(max(self._backoff * 2, BACKOFF_S), PAUSE_S)
                self._paused_until = time.monotonic() + self._backoff
                self._say(f"{e} (runs go on untracked; retried in {self._backoff:.0f} s)")
                raise
            except TrackingError as e:
                self._say(str(e))
                raise
            self._backoff = 0.0
            return out

        return call

    def _wait_s(self, most: float) -> float:
        """How long a caller on the tick's path may wait for the MLflow thread: not at all
        while it is behind (a call older than ``most``) or MLflow is away."""
        return 0.0 if self.down or self._thread.backlog_s() > most else most

    def warm(self) -> None:
        """Open the store on the MLflow thread now (an import of mlflow and a new store's
        migrations take seconds): the first launches need not wait for it."""
        if isinstance(self.rest, MlflowLocal):
            self._thread.submit(self._guard(self.rest.open))

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until the MLflow thread answered everything queued (tests, tools)."""
        try:
            self._thread.call(lambda: None, timeout_s)
        except TrackingUnavailable:
            return False
        return True

    # -- attempts ---------------------------------------------------------------------
    def _experiment(self, run: Run) -> str:
        """(On the MLflow thread.)"""
        name = run.spec.experiment or run.project
        if name not in self._experiments:
            assert self.rest is not None
            where = tracking_fields.experiment_artifacts(self.artifact_root, name)
            self._experiments[name] = self.rest.experiment_id(name, where)
        return self._experiments[name]

    def prepare(self, run: Run) -> None:
        """Resolve the run's experiment ahead of its launch (not waited for)."""
        if self.active and self.rest is not None and not self.adopts(run):
            self._thread.submit(self._guard(lambda: self._experiment(run)))

    def started(self, run: Run) -> dict[str, str]:
        """Make the attempt's MLflow run; the environment its job should get (empty when the
        run is not made within the launch's wait: it is made after, ``on_created``)."""
        if self.rest is None or run.placement is None:
            return {}
        key = (run.id, run.attempt)
        # A launch that does not wait notes a row without an id, which the late answer fills
        # (``mlflow_notes``). The two race on two threads: if the answer comes first it notes
        # the run itself and the launch notes nothing, so no row without an id stays behind.
        order = threading.Lock()
        made_first: list[str] = []

        def late(made: tuple[str, str | None]) -> None:
            with order:
                made_first.append(made[0])
                self._made_late(run, made[0])

        try:
            mlflow_id, exp = self._thread.call(
                self._guard(lambda: self._create(run, key)), self._wait_s(LAUNCH_WAIT_S), late
            )
        except TrackingError:  # (said by the guard, or the thread is behind: made later)
            with order:
                if not made_first:
                    self._notes([MlflowNote(run.id, run.attempt, "opened", None)])
            return {}
        assert self.uri is not None
        env = {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_RUN_ID": mlflow_id}
        if exp is not None:
            env["MLFLOW_EXPERIMENT_ID"] = exp
        return env

    def _create(self, run: Run, key: tuple[str, int]) -> tuple[str, str | None]:
        """(On the MLflow thread.) The attempt's MLflow run, adopted or new: (id, experiment
        or None when adopted)."""
        assert self.rest is not None
        tags = tracking_fields.tags(run)
        if run.spec.env.get(PARENT_ENV):
            tags["mlflow.parentRunId"] = run.spec.env[PARENT_ENV]
        params = tracking_fields.params(run)
        mlflow_id: str | None = None
        exp: str | None = None
        if self.adopts(run):  # the submitter made the first attempt's MLflow run (mlflow run)
            adopt = run.spec.env[ADOPT_ENV]
            try:
                self.rest.set_tags(adopt, tags)
                mlflow_id = adopt
            except TrackingUnavailable:
                raise
            except TrackingError as e:  # not in this store: this attempt gets its own run
                self._say(f"run {run.id}: its MLflow run {adopt} cannot be used ({e}); "
                          f"it gets a new one")  # fmt: skip
        if mlflow_id is None:
            exp = self._experiment(run)
            name = f"{run.spec.name} #{run.attempt}"
            mlflow_id = self.rest.create_run(exp, name, tags, start=run.admitted_at)
        try:  # (a param the submitter's run already has with another value fails alone)
            self.rest.log_batch(mlflow_id, [], {}, params)
        except TrackingUnavailable:
            raise
        except TrackingError as e:
            self._say(f"run {run.id}: params not logged: {e}")
        self._ids[key] = mlflow_id
        return mlflow_id, exp

    def _notes(self, notes: list[MlflowNote]) -> None:
        if self.note is not None:
            self.note(notes)

    def _made_late(self, run: Run, mlflow_id: str) -> None:
        """An attempt's MLflow run made after its launch: noted, in the row its launch noted
        without an id (else a row of its own)."""
        self._notes([MlflowNote(run.id, run.attempt, "made", mlflow_id)])

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
        rest = self.rest
        tags = {"mlops_gpu.run_id": run.id, "mlops_gpu.attempt": str(run.attempt)}
        try:
            found = self._thread.call(
                self._guard(lambda: rest.find_run(self._experiment(run), tags)),
                self._wait_s(LAUNCH_WAIT_S),
            )
        except TrackingError:
            return None
        return str(found) if found is not None else None

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
        tags name, else one made now: its launch went on without); the id of the MLflow run
        closed, or None (MLflow failed: ``down`` says whether it is away). ``mean_utilization``:
        the launcher's, logged here when the launcher could not. (On the tracking worker.)"""
        if self.rest is None or run.placement is None or run.admitted_at is None:
            return None
        rest = self.rest

        def close() -> str:
            key = (run.id, run.attempt)
            found = mlflow_id or self._ids.pop(key, None)
            if found is None and self.adopts(run):  # (maybe in another experiment)
                found = run.spec.env[ADOPT_ENV]
            tags = {"mlops_gpu.run_id": run.id, "mlops_gpu.attempt": str(run.attempt)}
            found = found or rest.find_run(self._experiment(run), tags)
            if found is None:  # made now: its launch did not wait for MLflow
                found, _ = self._create(run, key)
                self._ids.pop(key, None)
                self._made_late(run, found)
            p = run.placement
            assert p is not None and run.admitted_at is not None
            hours = p.gpu_amount * max(end - run.admitted_at, 0.0) / 3600
            self._close(found, outcome, end, hours, p.gpu_type, run.queue_wait_s or 0.0,
                        mean_utilization, lost_gpu_s)  # fmt: skip
            return found

        try:
            return str(self._thread.call(self._guard(close), CLOSE_WAIT_S))
        except TrackingError:
            return None

    def close_recovered(
        self, u: UnclosedMlflowRun, run: Run | None = None
    ) -> list[MlflowNote] | None:
        """Close an attempt's MLflow run from the store's record (``TrackingQueue.recover``):
        the usage ledger's figures, or, for an attempt that never held GPUs, FAILED as
        ``launch_failed``. One noted without an id: the run found by its tags, or made now
        from ``run`` (the store's record of the run). The notes to write (the run made or
        found, and closed), or None if MLflow did not take it. (On the tracking worker.)"""
        if self.rest is None:
            return None
        rest = self.rest
        key = (u.run_id, u.attempt)

        def close() -> list[MlflowNote]:
            mlflow_id = u.mlflow_run_id
            made: list[MlflowNote] = []
            if mlflow_id is None:
                found = self._recovered_run(u, run)
                if found is None:  # (never held GPUs, no MLflow run: none to close)
                    return [MlflowNote(*key, "closed", None)]
                mlflow_id = found
                made = [MlflowNote(*key, "made", found)]
            if u.outcome is None:
                rest.log_batch(mlflow_id, [], {"mlops_gpu.outcome": "launch_failed"})
                rest.finish(mlflow_id, "FAILED", None)
            else:
                wait = None if u.queued_at is None else max(u.start - u.queued_at, 0.0)
                self._close(mlflow_id, u.outcome, u.end, u.gpu_seconds / 3600,
                            u.gpu_type, wait, u.mean_util, u.lost_gpu_s)  # fmt: skip
            return [*made, MlflowNote(*key, "closed", mlflow_id)]

        try:
            return list(self._thread.call(self._guard(close), CLOSE_WAIT_S))
        except TrackingError:
            return None

    def _recovered_run(self, u: UnclosedMlflowRun, run: Run | None) -> str | None:
        """(On the MLflow thread.) The MLflow run of an attempt noted without one: found by its
        tags, else made now (when the attempt held GPUs and the run is known)."""
        assert self.rest is not None
        tags = {"mlops_gpu.run_id": u.run_id, "mlops_gpu.attempt": str(u.attempt)}
        if run is None:
            return None
        exp = self._experiment(run)
        found = self.rest.find_run(exp, tags)
        if found is not None or u.outcome is None:
            return found
        tags.update(tracking_fields.recovered_tags(run, u.attempt, u.gpu_type))
        made = self.rest.create_run(exp, f"{run.spec.name} #{u.attempt}", tags, start=u.start)
        self.rest.log_batch(made, [], {}, tracking_fields.params(run))
        return made

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
        """Two writes: the metrics with the outcome tag (one log-batch), then the status.
        (On the MLflow thread.)"""
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
            metrics.append(("mlops_gpu.lost_gpu_s", lost_gpu_s, end, 0))
        metrics = [(k, tracking_fields.rounded(k, v), t, s) for k, v, t, s in metrics]
        assert self.rest is not None
        self.rest.log_batch(mlflow_id, metrics, {"mlops_gpu.outcome": outcome})
        self.rest.finish(mlflow_id, STATUS.get(outcome, "FAILED"), end)
