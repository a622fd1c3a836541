"""Launching admitted runs (step 6 of a tick): each run's MLflow run and backend job.

An admission is recorded in the store before its backend is asked to launch (``tick``), and a
launch that fails rolls it back: the run is pending again, or cancelled if its cancel was
requested meanwhile, or failed once its launch failed ``retry.max_attempts`` times in a row
(``model.lifecycle``: ``rollback``, ``after_launch_failure``).
Runs on backends whose launches are slow round trips (``parallel_launch``) start concurrently.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from mlops_gpu.backends import LaunchRequest
from mlops_gpu.model import Phase, Run
from mlops_gpu.model.lifecycle import after_launch_failure
from mlops_gpu.tracking.close_queue import Ended

if TYPE_CHECKING:
    from mlops_gpu.controller.loop import Controller
    from mlops_gpu.controller.tick import TickReport

#: Concurrent launches on backends that ask for it (``parallel_launch``): each is a round trip
#: to a cluster's controller (sbatch, the Kubernetes API), mostly waiting.
LAUNCH_THREADS = 8


def start_jobs(ctl: Controller, runs: list[Run]) -> list[tuple[str | Exception, str | None]]:
    """Each admitted run's MLflow run and backend job: the handle, or why it failed. Runs on
    backends whose launches are slow round trips (capability ``parallel_launch``: Slurm,
    Kubernetes) start concurrently; the others in order."""
    with ctl.tracking.priority():  # MLflow closes wait while runs start
        return _start_all(ctl, runs)


def _start_all(ctl: Controller, runs: list[Run]) -> list[tuple[str | Exception, str | None]]:
    base = {"MLOPS_GPU_CONFIG": str(ctl.rt.cfg.source)} if ctl.rt.cfg.source else {}
    for run in runs:
        ctl.tracker.prepare(run)  # experiments resolved here, not by racing threads

    def start(run: Run) -> tuple[str | Exception, str | None]:
        """(the handle or the launch's error, the attempt's MLflow run id)."""
        assert run.placement is not None
        env = dict(base)
        env.update(ctl.tracker.started(run))  # the attempt's MLflow run, if configured
        req = LaunchRequest(run.id, run.attempt, run.spec, run.placement, env, ctl.launcher)
        try:
            return ctl.rt.backends[run.placement.backend].launch(req), env.get("MLFLOW_RUN_ID")
        except Exception as e:  # any launch failure rolls the admission back
            return e, env.get("MLFLOW_RUN_ID")  # (noted: its MLflow run is closed FAILED)

    def parallel(run: Run) -> bool:
        backend = ctl.rt.backends[run.placement.backend] if run.placement else None
        return backend is not None and backend.capabilities.parallel_launch

    out: list[tuple[str | Exception, str | None] | None] = [None] * len(runs)
    fan = [i for i, r in enumerate(runs) if parallel(r)]
    if len(fan) > 1:
        if ctl._pool is None:
            ctl._pool = ThreadPoolExecutor(LAUNCH_THREADS, thread_name_prefix="launch")
        for i, result in zip(fan, ctl._pool.map(start, [runs[i] for i in fan]), strict=True):
            out[i] = result
    for i, run in enumerate(runs):
        if out[i] is None:
            out[i] = start(run)
    return [r for r in out if r is not None]


def launched(
    ctl: Controller, run: Run, started: tuple[str | Exception, str | None], rep: TickReport
) -> str | None:
    """A launch's outcome: the handle to store, or None after rolling the admission back."""
    store = ctl.rt.store
    assert run.placement is not None
    result, mlflow_id = started  # (its MLflow run was noted by the caller)
    bname = run.placement.backend
    if isinstance(result, Exception):
        rep.launch_failures += 1
        ctl._launch_failures[run.id] += 1
        n = ctl._launch_failures[run.id]
        msg = f"launch on {bname} failed ({n}x): {result}"
        retried = False
        rolled_back = store.rollback_admission(run.id, msg, now=ctl.clock())
        after = after_launch_failure(rolled_back, n, ctl.rt.cfg.retry.max_attempts)
        if after is Phase.CANCELLED:
            ctl._emit("cancelled", run, msg)
        elif after is Phase.FAILED:
            store.finish(run.id, Phase.FAILED, msg, now=ctl.clock())
            ctl._emit("failed", run, msg)
        else:
            retried = True
            ctl._emit("launch_failed", run, msg)
        # it never ran: no GPU-hours (the ledger books none either). Its retry, the same
        # attempt number, gets its own MLflow run, except the submitter's, adopted again.
        if mlflow_id is not None and not (retried and ctl.tracker.adopts(run)):
            ctl.tracker.forget(run)  # (never looked up by its tags: the retry has the same)
            end = run.admitted_at or ctl.clock()
            ctl._ended.append(Ended(run, "launch_failed", end, mlflow_run_id=mlflow_id))
        return None
    ctl._launch_failures.pop(run.id, None)  # (the caller stores the handle)
    rep.admitted += 1
    ctl._emit(
        "started",
        run,
        f"on {','.join(run.placement.node_names)} "
        f"devices {','.join(d for s in run.placement.slots for d in s.devices)}",
    )
    return result
