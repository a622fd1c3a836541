"""Start-up reconcile: the runs the store calls active matched with the backends' jobs.

A scheduler that stopped (crashed, was killed, lost its host) may leave runs whose backend is no
longer configured (requeued as lost) and admissions without a stored handle: the stop came
between the admission and the handle. Their job is looked for by (run id, attempt): one found is
adopted, else the admission is rolled back; a preemptor still waiting for its victims keeps
waiting (``gate``). So after a crash a run is never launched twice, and its GPUs are never
booked twice. The MLflow runs of attempts that ended meanwhile are closed
(``tracking.close_queue``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlops_gpu.backends import Backend
from mlops_gpu.controller import gate
from mlops_gpu.model import ACTIVE_PHASES, Phase, Run
from mlops_gpu.state.mlflow_notes import MlflowNote

if TYPE_CHECKING:
    from mlops_gpu.controller.loop import Controller


def reconcile(ctl: Controller) -> int:
    """Match runs the store calls active with the backends' jobs; returns runs repaired."""
    store, fixed = ctl.rt.store, 0
    live = store.list_runs(ACTIVE_PHASES)
    for run in live:
        backend = ctl.rt.backends.get(run.placement.backend) if run.placement else None
        if backend is None:
            name = run.placement.backend if run.placement else "?"
            store.requeue(
                run.id,
                "lost",
                f"backend {name} is not configured",
                ctl.rt.cfg.retry.max_attempts,
                now=ctl.clock(),
            )
            fixed += 1
            continue
        if run.handle is None:
            fixed += _unlaunched(ctl, run, backend, live)
    # MLflow runs of attempts that ended while we were away, and of admissions just rolled
    # back: noted, never closed, their attempt no longer active (closed FAILED: no GPUs)
    ctl.tracking.recover()
    return fixed


def _unlaunched(ctl: Controller, run: Run, backend: Backend, live: list[Run]) -> int:
    """An admission without a stored handle found at start-up: the stop came between the
    admission and the stored handle (maybe after the attempt's MLflow run was made, maybe
    after its job was created, maybe both), or it is a preemptor waiting for its victims
    (``gate``), which keeps waiting. Returns 1 if the run was repaired."""
    handle = backend.find(run.id, run.attempt)
    if handle is None and gate.blockers(run, live, gate.going_ids(live)):
        ctl.gate.hold(run.id)  # (never launched: no MLflow run, no job)
        return 0
    _note_attempt_mlflow_run(ctl, run)
    if handle is not None:
        ctl.rt.store.set_handle(run.id, handle, Phase.STARTING, now=ctl.clock())
        ctl._emit("recovered", run, f"found its job {handle} after a restart")
    else:
        ctl.rt.store.rollback_admission(
            run.id, "the scheduler stopped before launching it", now=ctl.clock()
        )
        ctl._emit("rolled_back", run, "admission without a launch, requeued")
    return 1


def _note_attempt_mlflow_run(ctl: Controller, run: Run) -> None:
    """Note the MLflow run of ``run``'s current attempt if it was made but not noted (the
    scheduler stopped in between; found by its tags), so that whatever becomes of the
    attempt closes it: a job found runs on in it, an admission rolled back has it closed
    FAILED by the recovery of unclosed runs, which reads the notes."""
    noted = any(link.attempt == run.attempt for link in ctl.rt.store.mlflow_links(run.id))
    if not noted and (found := ctl.tracker.find_attempt(run)) is not None:
        note = MlflowNote(run.id, run.attempt, "opened", found)
        ctl.rt.store.note_mlflow([note], now=ctl.clock())
