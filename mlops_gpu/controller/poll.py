"""What the backends report (steps 1 and 2 of a tick): jobs that started, went idle or ended,
and the stop signals for runs whose cancel or preemption was requested or whose max runtime
passed.

One batched poll per backend; a backend that does not answer leaves its runs as they are. A
job's end is recorded once (the store's compare-and-set): what it means (succeeded, failed or
cancelled, or requeued as the next attempt when it was preempted or lost) is the run
lifecycle's ``job_end`` (``model.lifecycle``). Each attempt is signalled at most
once per process.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING, Literal

from mlops_gpu.backends import Backend, HandleError, JobState, JobStatus
from mlops_gpu.model import Phase, Run
from mlops_gpu.model.lifecycle import JobEnd, Requeue, job_end, overdue
from mlops_gpu.tracking.close_queue import Ended

if TYPE_CHECKING:
    from mlops_gpu.controller.loop import Controller
    from mlops_gpu.controller.tick import TickReport


#: A job's end as the lifecycle reads it (``model.lifecycle.JobEnd``).
_OUTCOME: dict[JobState, Literal["succeeded", "failed", "lost"]] = {
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.LOST: "lost",
}


def poll(ctl: Controller, active: list[Run], rep: TickReport) -> None:
    samples = ctl.samples.collect()
    by_backend: dict[str, list[Run]] = defaultdict(list)
    for run in active:
        if run.handle is not None and run.placement is not None:
            by_backend[run.placement.backend].append(run)
    for bname, runs in by_backend.items():
        backend = ctl.rt.backends.get(bname)
        if backend is None:
            continue
        try:
            statuses = backend.poll([r.handle for r in runs if r.handle])
        except Exception as e:  # a cluster that does not answer: its runs stay as they are
            ctl._say_once(f"backend {bname}: poll failed ({e}); its runs are unchanged")
            continue
        started: list[str] = []  # marked running in one transaction
        for run in runs:
            st = statuses.get(run.handle or "")
            if st is not None:
                _apply(ctl, run, st, rep, started)
                if st.state is JobState.RUNNING and st.telemetry is not None:
                    samples.add(run, st.telemetry, ctl.clock())
        ctl.rt.store.mark_running_many(started, now=ctl.clock())
    if (problem := samples.publish()) is not None:
        ctl._say_once(problem)


def _apply(ctl: Controller, run: Run, st: JobStatus, rep: TickReport, started: list[str]) -> None:
    store, now = ctl.rt.store, ctl.clock()
    if st.state in (JobState.STARTING,):
        return
    tel = st.telemetry
    if st.state is JobState.RUNNING:
        if run.phase is not Phase.RUNNING:
            started.append(run.id)
        if tel is not None and tel.idle_since is not None:
            _flag_idle(ctl, run, tel.idle_since, now)
        return
    ctl._signalled.discard((run.id, run.attempt))
    ctl._flagged_idle.discard((run.id, run.attempt))
    # what the launcher measured goes into the usage ledger with the attempt
    util, idle_s = (tel.mean_utilization, tel.idle_s) if tel else (None, 0.0)
    cfg = ctl.rt.cfg
    end = JobEnd(
        _OUTCOME.get(st.state, "failed"),
        st.exit_code,
        st.reason,
        st.finished_at,
        stopped_idle=cfg.telemetry.stop_idle and tel is not None and tel.idle_s > 0,
    )
    backoff_s = cfg.retry.backoff(run.attempt + 1)
    what = job_end(run, end, now, cfg.retry.max_attempts, backoff_s)  # (``model.lifecycle``)
    if isinstance(what, Requeue):
        phase = store.requeue(run.id, what.kind, what.reason, what.max_attempts, now=now,
                              backoff_s=what.backoff_s, mean_util=util, idle_s=idle_s)  # fmt: skip
        rep.requeued += 1
        if what.kind == "lost":
            ctl._ended.append(Ended(run, "lost", now, util))
            ctl._emit("lost", run, f"{st.reason}; now {phase}")
            return
        lost = [e.lost_gpu_s for e in store.events(run.id)
                if e.kind == "preempting" and e.attempt == run.attempt]  # fmt: skip
        ctl._ended.append(Ended(run, "preempted", now, util, lost_gpu_s=(lost or [None])[-1]))
        ctl._emit("preempted", run, f"now {phase}")
        return
    if store.finish(
        run.id,
        what.phase,
        what.reason,
        exit_code=st.exit_code,
        now=what.at,
        started_at=st.started_at,
        mean_util=util,
        idle_s=idle_s,
    ):
        rep.finished += 1
        ctl._ended.append(Ended(run, what.phase.value, what.at, util))
        ctl._emit(what.phase.value, run, what.reason)


def _flag_idle(ctl: Controller, run: Run, since: float, now: float) -> None:
    key = (run.id, run.attempt)
    if key in ctl._flagged_idle:
        return
    ctl._flagged_idle.add(key)
    t = ctl.rt.cfg.telemetry
    when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(since))
    why = f"its GPUs have been idle (under {t.idle_below_pct:g}% utilization) since {when}"
    why += "; stopping it" if t.stop_idle else "; wasting GPU time"
    if ctl.rt.store.flag(run.id, "idle", why, now=now):
        ctl._emit("idle", run, why)


def stop_cancelled(ctl: Controller, active: list[Run]) -> None:
    """Signal runs whose cancel was requested, and runs flagged for preemption that this
    process has not signalled (a scheduler that stopped between flag and signal: their
    preemptors wait for them to exit), and runs past a max runtime shortened after their
    launch (``lifecycle.overdue``). Once per attempt (``send_stop``)."""
    for run in active:
        stop = run.cancel_requested or run.preempt_requested or overdue(run, ctl.clock())
        if stop and run.handle is not None:
            send_stop(ctl, run, run.spec.checkpoint.signal, run.spec.checkpoint.grace_s)


def send_stop(ctl: Controller, run: Run, signal: str, grace_s: float) -> None:
    key = (run.id, run.attempt)
    if key in ctl._signalled or run.handle is None or run.placement is None:
        return
    backend: Backend = ctl.rt.backends[run.placement.backend]
    try:
        backend.cancel(run.handle, signal, grace_s)
    except HandleError as e:
        ctl._emit("signal_failed", run, str(e))
    ctl._signalled.add(key)
