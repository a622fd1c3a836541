"""``Controller``: reconcile ticks, store -> core decision -> backends -> store.

The controller reads the store through its change feed into a ``Mirror`` (live runs plus the
incremental core), so a tick costs what changed since the last one. One tick:
1. poll: ask each backend, in one batched call, about every active run's job, and record what
   ended (succeeded, failed, cancelled, preempted -> requeued, lost -> requeued);
2. stop: send the checkpoint signal to runs whose cancel was requested (once per process);
3. snapshot: catch up with the store's changes; nodes from the backends, the config, the usage
   ledger (fair share, budgets);
4. decide: one cycle of the incremental core (the same decision ``decide`` makes from scratch);
5. preempt: flag victims in the store (each ``preempting`` event with the GPU-seconds of work
   it throws away), then signal them;
6. admit: record each admission, then launch it once no job still holds its devices (``gate``:
   a preemptor admitted with its victims waits, ``admitted`` and holding its placement, until
   they exit; a later tick launches it); roll the admission back if the launch fails (a run
   whose launch failed ``max_attempts`` times in a row fails);
7. explain: store the reason (and ETA) of every run left pending: every tick for a queue of
   up to ``EXPLAIN_EVERY_TICK_UP_TO`` runs, else at most every ``scheduler.explain_s`` (a pass
   over the whole queue that admission need not wait for).

The controller keeps the usage ledger it has read and asks the store only for newer rows
(with a full re-read every ``LEDGER_RELOAD_S``), so a tick does not re-read the history.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from mlops_gpu.backends import (
    Backend,
    HandleError,
    JobState,
    JobStatus,
    LauncherSettings,
    LaunchRequest,
    warm,
)
from mlops_gpu.controller import accounting, gate
from mlops_gpu.controller.mirror import Mirror
from mlops_gpu.controller.overtime import ended_overdue, overdue
from mlops_gpu.controller.pools import PoolControl
from mlops_gpu.controller.runtime import Runtime
from mlops_gpu.controller.samples import GpuSamples
from mlops_gpu.core import Snapshot
from mlops_gpu.core.decision import ReasonCode
from mlops_gpu.model import ACTIVE_PHASES, Phase, Run
from mlops_gpu.state import ConflictError, LeaderLock, LeadershipLost, UsageRow, observed
from mlops_gpu.state.jobs import cancel_doomed
from mlops_gpu.tracking.close_queue import Ended, TrackingQueue
from mlops_gpu.tracking.tracker import Tracker

log = logging.getLogger("mlops_gpu.controller")

#: Queues up to this long are explained every tick (it costs a few milliseconds); longer ones
#: at most every ``scheduler.explain_s``.
EXPLAIN_EVERY_TICK_UP_TO = 1000
#: A full re-read of the ledger this often: ids from concurrent writers may commit out of order.
LEDGER_RELOAD_S = 60.0
#: Concurrent launches on backends that ask for it (``parallel_launch``): each is a round trip
#: to a cluster's controller (sbatch, the Kubernetes API), mostly waiting.
LAUNCH_THREADS = 8

EventSink = Callable[[str, Run | None, str], None]


@dataclass
class TickReport:
    admitted: int = 0
    finished: int = 0
    requeued: int = 0
    launch_failures: int = 0
    pending: int = 0
    active: int = 0
    #: pending runs explained this tick as ``invalid`` (their project or class is not in the
    #: config): they cannot start until the config changes, so they do not keep an idle
    #: scheduler from exiting (0 on ticks that explained nothing)
    invalid: int = 0
    messages: list[str] = field(default_factory=list)


def build_snapshot(
    rt: Runtime,
    pending: list[Run],
    active: list[Run],
    now: float,
    with_usage: bool = True,
    ledger: Callable[[float], list[UsageRow]] | None = None,
) -> Snapshot:
    """The core's input. ``with_usage`` reads the ledger for fair share and budgets (a read
    verb such as ``nodes`` needs neither); ``ledger(since)`` gives its rows (default: read
    them from the store)."""
    tmpl = template(rt, now)
    history: dict[tuple[str, str], float] = {}
    spent: dict[str, tuple[float, float]] = {}
    if with_usage:
        history, spent = usage_inputs(rt, tmpl, active, ledger)
    return replace(
        tmpl,
        pending=tuple(pending),
        active=tuple(active),
        usage_history=history,
        spent=spent,
    )


def usage_inputs(
    rt: Runtime,
    tmpl: Snapshot,
    active: list[Run],
    ledger: Callable[[float], list[UsageRow]] | None = None,
) -> tuple[dict[tuple[str, str], float], dict[str, tuple[float, float]]]:
    """(decayed usage history for fair share, what budgeted projects spent) at ``tmpl.now``,
    from the ledger; projects, prices and policy come from the template (``template``)."""
    now, half_life = tmpl.now, tmpl.policy.half_life_s
    since = accounting.ledger_since(now, half_life, tmpl.projects)
    rows = ledger(since) if ledger is not None else rt.store.usage(since=since)
    history = accounting.usage_history(rows, now, half_life)
    spent = accounting.spent(rows, active, now, tmpl.projects, tmpl.gpu_types)
    return history, spent


def template(rt: Runtime, now: float) -> Snapshot:
    """The core's input without runs or usage: nodes, projects, classes, policy, capabilities."""
    cfg = rt.cfg
    return Snapshot(
        now=now,
        nodes=tuple(rt.nodes()),
        pending=(),
        active=(),
        projects=cfg.model_projects(),
        gpu_types=cfg.model_gpu_types(),
        priority_classes=dict(cfg.priority_classes),
        cohorts=cfg.model_cohorts(),
        policy=cfg.policy_settings(),
        capabilities={n: b.capabilities for n, b in rt.backends.items()},
    )


class LeaderError(RuntimeError):
    """Another scheduler already runs against this store."""


class Controller:
    def __init__(
        self, rt: Runtime, clock: Callable[[], float] = time.time, on_event: EventSink | None = None
    ) -> None:
        self.rt = rt
        self.clock = clock
        self.on_event = on_event
        self._signalled: set[tuple[str, int]] = set()
        self._launch_failures: dict[str, int] = defaultdict(int)
        self._lock: LeaderLock | None = None
        self._last_explain = float("-inf")
        self._ledger: list[UsageRow] = []
        self._ledger_id = 0
        self._ledger_read_at = float("-inf")
        self.mirror = Mirror(rt.store)
        uri = rt.cfg.tracking_uri(dict(os.environ)) if rt.cfg.mlflow.enabled else None
        root = rt.cfg.artifact_root(uri) if uri else None
        self.tracker = Tracker(uri, rt.cfg.model_gpu_types(), artifact_root=root)
        self.tracking = TrackingQueue(self.tracker, rt.store)
        t = rt.cfg.telemetry
        self.launcher = (
            LauncherSettings(t.interval_s, t.idle_below_pct, t.idle_after_s, t.stop_idle)
            if t.launcher
            else None
        )
        self._flagged_idle: set[tuple[str, int]] = set()
        #: attempts that ended this tick, their MLflow runs' closes queued at the tick's end
        self._ended: list[Ended] = []
        self._pool: ThreadPoolExecutor | None = None
        self._said: set[str] = set()
        #: Ticks poll the backends only if this long passed since the last poll: the daemon
        #: sets half its tick, so ticks woken early by a submit admit without listing every
        #: job again; 0 (a bare ``tick()``): every tick polls.
        self.min_poll_gap_s = 0.0
        self._polled_at = float("-inf")
        self._cold: set[str] = set()  # backends whose warm hook failed last time
        self._tracker_warm = False
        #: admitted runs held back until their devices' jobs exit
        self.gate = gate.Gate(rt.store, self.clock, self._emit)
        #: this process's cycle latencies (seconds per ``tick``), for metrics
        self.cycles = observed.Histogram(observed.CYCLE_BUCKETS)
        #: the launchers' last GPU samples, published for metrics
        self.samples = GpuSamples(rt.store)
        #: elastic pools: powered-down nodes offered to the core when a boot is worth it
        self.pools = PoolControl(rt)

    # -- leadership ---------------------------------------------------------------------
    def acquire(self) -> None:
        lock = LeaderLock(self.rt.store, self.rt.cfg.scheduler.lease)
        if not lock.acquire():
            raise LeaderError(f"another scheduler is running against {self.rt.cfg.store_url}")
        self._lock = lock

    def _renew(self) -> None:
        """Renew the lease before the tick writes anything; a scheduler replaced while it was
        stopped learns it here (or at its first write) and stops (``LeaderError``)."""
        if self._lock is not None:
            self._lock.renew()  # (LeadershipLost: ``tick`` turns it into LeaderError)

    def release(self) -> None:
        self.tracking.close()  # (what it cannot close in time, the next start's reconcile does)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _emit(self, kind: str, run: Run | None, msg: str) -> None:
        log.info("%s %s %s", kind, run.id if run else "-", msg)
        if self.on_event is not None:
            self.on_event(kind, run, msg)

    # -- start-up -------------------------------------------------------------------------
    def warm(self) -> None:
        """Each backend's optional ``warm`` hook (ready before the work comes: a burst of runs
        submitted to a daemon just started must not wait for a client's imports). A failure is
        logged once, never raised: the tick that needs the backend reports it. The MLflow
        store is opened beside (``Tracker.warm``, once)."""
        if not self._tracker_warm:
            self._tracker_warm = True
            self.tracker.warm()
        for name, backend in self.rt.backends.items():
            try:
                warm(backend)
            except Exception as e:
                if name not in self._cold:
                    log.warning("backend %s is not ready: %s", name, e)
                self._cold.add(name)
            else:
                self._cold.discard(name)

    def reconcile(self) -> int:
        """Match runs the store calls active with the backends' jobs; returns runs repaired."""
        store, fixed = self.rt.store, 0
        live = store.list_runs(ACTIVE_PHASES)
        for run in live:
            backend = self.rt.backends.get(run.placement.backend) if run.placement else None
            if backend is None:
                name = run.placement.backend if run.placement else "?"
                store.requeue(
                    run.id,
                    "lost",
                    f"backend {name} is not configured",
                    self.rt.cfg.retry.max_attempts,
                    now=self.clock(),
                )
                fixed += 1
                continue
            if run.handle is None:
                fixed += self._unlaunched(run, backend, live)
        # MLflow runs of attempts that ended while we were away, and of admissions just rolled
        # back: noted, never closed, their attempt no longer active (closed FAILED: no GPUs)
        self.tracking.recover()
        return fixed

    def _unlaunched(self, run: Run, backend: Backend, live: list[Run]) -> int:
        """An admission without a stored handle found at start-up: the stop came between the
        admission and the stored handle (maybe after the attempt's MLflow run was made, maybe
        after its job was created, maybe both), or it is a preemptor waiting for its victims
        (``gate``), which keeps waiting. Returns 1 if the run was repaired."""
        handle = backend.find(run.id, run.attempt)
        if handle is None and gate.blockers(run, live, gate.going_ids(live)):
            self.gate.hold(run.id)  # (never launched: no MLflow run, no job)
            return 0
        self._note_attempt_mlflow_run(run)
        if handle is not None:
            self.rt.store.set_handle(run.id, handle, Phase.STARTING, now=self.clock())
            self._emit("recovered", run, f"found its job {handle} after a restart")
        else:
            self.rt.store.rollback_admission(
                run.id, "the scheduler stopped before launching it", now=self.clock()
            )
            self._emit("rolled_back", run, "admission without a launch, requeued")
        return 1

    def _note_attempt_mlflow_run(self, run: Run) -> None:
        """Note the MLflow run of ``run``'s current attempt if it was made but not noted (the
        scheduler stopped in between; found by its tags), so that whatever becomes of the
        attempt closes it: a job found runs on in it, an admission rolled back has it closed
        FAILED by the recovery of unclosed runs, which reads the notes."""
        noted = any(e.kind == "mlflow_run" and e.attempt == run.attempt
                    for e in self.rt.store.events(run.id))  # fmt: skip
        if not noted and (found := self.tracker.find_attempt(run)) is not None:
            self.rt.store.note(run.id, run.attempt, "mlflow_run", found, now=self.clock())

    # -- the tick -------------------------------------------------------------------------
    def tick(self) -> TickReport:
        t0 = time.perf_counter()
        try:
            self._renew()
            return self._tick()
        except LeadershipLost as e:  # at the renewal or fenced at a write: another leads now
            self.mirror.reset()
            if self._lock is not None:
                self._lock.epoch = None  # (nothing to give up: it is another's now)
                self._lock = None
            raise LeaderError(str(e)) from e
        except BaseException:
            self.mirror.reset()  # whatever the engine applied may not have reached the store
            self._flush_tracking()  # what did end is queued for its MLflow close all the same
            raise
        finally:  # every cycle, failed ones too (the daemon publishes it: ``observed``)
            self.cycles.observe(time.perf_counter() - t0)

    def _tick(self) -> TickReport:
        rep = TickReport()
        store, mirror = self.rt.store, self.mirror
        tmpl = template(self.rt, self.clock())
        if (opened := self.pools.open(tmpl.nodes, tmpl.now)) is not tmpl.nodes:
            tmpl = replace(tmpl, nodes=opened)  # powered-down nodes a boot was decided for
        mirror.refresh(tmpl)
        if time.monotonic() - self._polled_at >= self.min_poll_gap_s:  # 1. poll
            self._polled_at = time.monotonic()
            self._poll(mirror.active(), rep)
            mirror.refresh(tmpl)
        active = mirror.active()
        self._stop_cancelled(active)  # 2. stop
        pending = mirror.pending()
        now = self.clock()  # 3. snapshot
        history, spent = usage_inputs(self.rt, replace(tmpl, now=now), active, self._ledger_rows)
        explain = (
            len(pending) <= EXPLAIN_EVERY_TICK_UP_TO
            or now - self._last_explain >= self.rt.cfg.scheduler.explain_s
        )
        by_id = dict(mirror.runs)
        t_decide = time.monotonic()
        decision = mirror.cycle(now, history, spent)  # 4. decide
        t_admit = time.monotonic()
        for pre in decision.preemptions:  # 5. preempt
            run = by_id[pre.run_id]
            lost = pre.lost_gpu_s  # (both engines fill it: the native tests compare them)
            store.mark_preempting(run.id, pre.reason, now=self.clock(), lost_gpu_s=lost)
            self._signal(run, pre.signal, pre.grace_s)
            self._emit("preempting", run, f"{pre.reason}; loses {lost:.0f} GPU-s of work")
        if decision.doomed:  # dependencies that can never be met: cancelled with the reason
            cancel_doomed(store, [(p.run_id, p.reason) for p in decision.doomed], self.clock())
        launched: dict[str, dict[str, str]] = defaultdict(dict)  # backend -> handle -> run id
        fresh: list[Run] = []
        adms = decision.admissions  # 6. admit (one transaction), then launch
        oks = store.admit_many([(a.run_id, a.placement) for a in adms], now=self.clock(),
                               decided={a.run_id: by_id[a.run_id].spec for a in adms})  # fmt: skip
        for adm, ok in zip(adms, oks, strict=True):
            if ok:  # (False: cancelled or updated meanwhile)
                got = store.get(adm.run_id)
                assert got is not None and got.placement is not None
                fresh.append(got)
        going = gate.going_ids(active, (p.run_id for p in decision.preemptions))
        admitted, held = self.gate.split(fresh, active, going, now)
        handles: list[tuple[str, str]] = []
        t_launch = time.monotonic()
        started = self._start_jobs(admitted)
        # Each attempt's MLflow run (Run.mlflow_run_id, the Prefect worker's link; and what a
        # start closes if the attempt ended unclosed): one transaction for the tick's launches
        store.note_many([(r.id, r.attempt, "mlflow_run", m)
                         for r, (_, m) in zip(admitted, started, strict=True) if m is not None],
                        now=self.clock())  # fmt: skip
        for run, result in zip(admitted, started, strict=True):
            handle = self._launched(run, result, rep)
            if handle is not None and run.placement is not None:
                launched[run.placement.backend][handle] = run.id
                handles.append((run.id, handle))
        store.set_handles(handles, Phase.STARTING, now=self.clock())
        if admitted:  # where a busy tick's time goes (ms)
            t_end = time.monotonic()
            log.info("tick: %d admitted of %d pending; decide %.0f, admit %.0f, launch %.0f ms",
                     len(admitted), len(pending), 1000 * (t_admit - t_decide),
                     1000 * (t_launch - t_admit), 1000 * (t_end - t_launch))  # fmt: skip
        for bname, by_handle in launched.items():  # one batched poll: most starts are immediate
            backend = self.rt.backends[bname]
            if not backend.capabilities.starts_at_once:
                continue  # (its jobs take seconds to start: the next tick's poll sees them)
            sts = backend.poll(list(by_handle)).values()
            up = [by_handle[st.handle] for st in sts if st.state is JobState.RUNNING]
            store.mark_running_many(up, now=self.clock())
        if explain:  # 7. explain
            self._last_explain = now
            reasons = mirror.explain(now, history, spent)
            reasons = self.pools.explain(now, reasons, by_id, active, tmpl.nodes, spent)
            store.set_reasons([(p.run_id, p.reason_code.value, p.reason, p.eta) for p in reasons])
            rep.invalid = sum(p.reason_code is ReasonCode.INVALID for p in reasons)
        self._flush_tracking()
        rep.pending = len(pending) - len(decision.admissions)
        rep.active = len(active) + rep.admitted + held
        return rep

    def _flush_tracking(self) -> None:
        """Queue the closes of the MLflow runs of attempts that ended this tick: the tracking
        worker makes them (``tracking.close_queue``), so MLflow's writes never delay a tick."""
        ended, self._ended = self._ended, []
        self.tracking.put(ended)

    def drain_tracking(self, timeout_s: float = 30.0) -> bool:
        """Wait until the MLflow runs of the attempts that ended so far are closed."""
        return self.tracking.drain(timeout_s)

    def _ledger_rows(self, since: float) -> list[UsageRow]:
        """The ledger rows ending at or after ``since``: new rows added to those already read."""
        store, now = self.rt.store, time.monotonic()
        if now - self._ledger_read_at >= LEDGER_RELOAD_S:
            self._ledger, self._ledger_read_at = store.usage(since=since), now
        else:
            self._ledger += store.usage(since=since, after_id=self._ledger_id)
        if self._ledger:
            self._ledger_id = max(self._ledger_id, self._ledger[-1].id)
        self._ledger = [r for r in self._ledger if r.end >= since]
        return self._ledger

    def _start_jobs(self, runs: list[Run]) -> list[tuple[str | Exception, str | None]]:
        """Each admitted run's MLflow run and backend job: the handle, or why it failed. Runs on
        backends whose launches are slow round trips (capability ``parallel_launch``: Slurm,
        Kubernetes) start concurrently; the others in order."""
        with self.tracking.priority():  # MLflow closes wait while runs start
            return self._start_all(runs)

    def _start_all(self, runs: list[Run]) -> list[tuple[str | Exception, str | None]]:
        base = {"MLOPS_GPU_CONFIG": str(self.rt.cfg.source)} if self.rt.cfg.source else {}
        for run in runs:
            self.tracker.prepare(run)  # experiments resolved here, not by racing threads

        def start(run: Run) -> tuple[str | Exception, str | None]:
            """(the handle or the launch's error, the attempt's MLflow run id)."""
            assert run.placement is not None
            env = dict(base)
            env.update(self.tracker.started(run))  # the attempt's MLflow run, if configured
            req = LaunchRequest(run.id, run.attempt, run.spec, run.placement, env, self.launcher)
            try:
                return self.rt.backends[run.placement.backend].launch(req), env.get("MLFLOW_RUN_ID")
            except Exception as e:  # any launch failure rolls the admission back
                return e, env.get("MLFLOW_RUN_ID")  # (noted: its MLflow run is closed FAILED)

        def parallel(run: Run) -> bool:
            backend = self.rt.backends[run.placement.backend] if run.placement else None
            return backend is not None and backend.capabilities.parallel_launch

        out: list[tuple[str | Exception, str | None] | None] = [None] * len(runs)
        fan = [i for i, r in enumerate(runs) if parallel(r)]
        if len(fan) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(LAUNCH_THREADS, thread_name_prefix="launch")
            for i, result in zip(fan, self._pool.map(start, [runs[i] for i in fan]), strict=True):
                out[i] = result
        for i, run in enumerate(runs):
            if out[i] is None:
                out[i] = start(run)
        return [r for r in out if r is not None]

    def _launched(
        self, run: Run, started: tuple[str | Exception, str | None], rep: TickReport
    ) -> str | None:
        """A launch's outcome: the handle to store, or None after rolling the admission back."""
        store = self.rt.store
        assert run.placement is not None
        result, mlflow_id = started  # (its MLflow run was noted by the caller)
        bname = run.placement.backend
        if isinstance(result, Exception):
            rep.launch_failures += 1
            self._launch_failures[run.id] += 1
            n = self._launch_failures[run.id]
            msg = f"launch on {bname} failed ({n}x): {result}"
            retried = False
            if store.rollback_admission(run.id, msg, now=self.clock()) is Phase.CANCELLED:
                self._emit("cancelled", run, msg)
            elif n >= self.rt.cfg.retry.max_attempts:
                store.finish(run.id, Phase.FAILED, msg, now=self.clock())
                self._emit("failed", run, msg)
            else:
                retried = True
                self._emit("launch_failed", run, msg)
            # it never ran: no GPU-hours (the ledger books none either). Its retry, the same
            # attempt number, gets its own MLflow run, except the submitter's, adopted again.
            if mlflow_id is not None and not (retried and self.tracker.adopts(run)):
                self.tracker.forget(run)  # (never looked up by its tags: the retry has the same)
                end = run.admitted_at or self.clock()
                self._ended.append(Ended(run, "launch_failed", end, mlflow_run_id=mlflow_id))
            return None
        self._launch_failures.pop(run.id, None)  # (the caller stores the handle)
        rep.admitted += 1
        self._emit(
            "started",
            run,
            f"on {','.join(run.placement.node_names)} "
            f"devices {','.join(d for s in run.placement.slots for d in s.devices)}",
        )
        return result

    def _poll(self, active: list[Run], rep: TickReport) -> None:
        samples = self.samples.collect()
        by_backend: dict[str, list[Run]] = defaultdict(list)
        for run in active:
            if run.handle is not None and run.placement is not None:
                by_backend[run.placement.backend].append(run)
        for bname, runs in by_backend.items():
            backend = self.rt.backends.get(bname)
            if backend is None:
                continue
            try:
                statuses = backend.poll([r.handle for r in runs if r.handle])
            except Exception as e:  # a cluster that does not answer: its runs stay as they are
                self._say_once(f"backend {bname}: poll failed ({e}); its runs are unchanged")
                continue
            started: list[str] = []  # marked running in one transaction
            for run in runs:
                st = statuses.get(run.handle or "")
                if st is not None:
                    self._apply(run, st, rep, started)
                    if st.state is JobState.RUNNING and st.telemetry is not None:
                        samples.add(run, st.telemetry, self.clock())
            self.rt.store.mark_running_many(started, now=self.clock())
        if (problem := samples.publish()) is not None:
            self._say_once(problem)

    def _apply(self, run: Run, st: JobStatus, rep: TickReport, started: list[str]) -> None:
        store, now = self.rt.store, self.clock()
        if st.state in (JobState.STARTING,):
            return
        tel = st.telemetry
        if st.state is JobState.RUNNING:
            if run.phase is not Phase.RUNNING:
                started.append(run.id)
            if tel is not None and tel.idle_since is not None:
                self._flag_idle(run, tel.idle_since, now)
            return
        self._signalled.discard((run.id, run.attempt))
        self._flagged_idle.discard((run.id, run.attempt))
        max_attempts = run.spec.max_attempts or self.rt.cfg.retry.max_attempts
        # what the launcher measured goes into the usage ledger with the attempt
        util, idle_s = (tel.mean_utilization, tel.idle_s) if tel else (None, 0.0)
        # a job we were stopping may simply be gone (a deleted Kubernetes Job): that is the
        # stop we asked for, not a loss; so is an overdue one, which the controller stops
        # (``overtime``) before Kubernetes' own deadline: it ends failed below, not requeued
        stopping = (run.preempt_requested or run.cancel_requested
                    or overdue(run, st.finished_at or now))  # fmt: skip
        if st.state is JobState.LOST and not stopping:
            phase = store.requeue(
                run.id,
                "lost",
                st.reason or "the job vanished",
                max_attempts,
                now=now,
                backoff_s=self.rt.cfg.retry.backoff(run.attempt + 1),
                mean_util=util,
                idle_s=idle_s,
            )
            rep.requeued += 1
            self._ended.append(Ended(run, "lost", now, util))
            self._emit("lost", run, f"{st.reason}; now {phase}")
            return
        if run.preempt_requested and not run.cancel_requested:
            # A preemption is the scheduler's doing, not the run's fault: it does not use up
            # the run's retries, and the run keeps its submit time (its place in the queue).
            phase = store.requeue(
                run.id,
                "preempted",
                "preempted",
                None,
                now=now,
                backoff_s=self.rt.cfg.retry.backoff(run.attempt + 1),
                mean_util=util,
                idle_s=idle_s,
            )
            rep.requeued += 1
            lost = [e.lost_gpu_s for e in store.events(run.id)
                    if e.kind == "preempting" and e.attempt == run.attempt]  # fmt: skip
            self._ended.append(Ended(run, "preempted", now, util, lost_gpu_s=(lost or [None])[-1]))
            self._emit("preempted", run, f"now {phase}")
            return
        if run.cancel_requested:
            phase, why = Phase.CANCELLED, "cancelled by user"
        elif st.reason == "max_runtime" or ended_overdue(
            run, st.state is JobState.SUCCEEDED, st.finished_at, now
        ):
            phase = Phase.FAILED
            why = f"stopped after exceeding max_runtime {run.spec.max_runtime_s:g}s"
        elif st.state is JobState.SUCCEEDED:
            phase, why = Phase.SUCCEEDED, "exited 0"
        elif self.rt.cfg.telemetry.stop_idle and tel is not None and tel.idle_s > 0:
            phase = Phase.FAILED
            why = f"stopped because its GPUs sat idle (exited {st.exit_code})"
        else:
            phase, why = Phase.FAILED, f"exited {st.exit_code}"
        # The job's own end time (it may have ended while the scheduler was down), never
        # before its admission.
        end = max(now if st.finished_at is None else st.finished_at, run.admitted_at or 0.0)
        if store.finish(
            run.id,
            phase,
            why,
            exit_code=st.exit_code,
            now=min(end, now),
            started_at=st.started_at,
            mean_util=util,
            idle_s=idle_s,
        ):
            rep.finished += 1
            self._ended.append(Ended(run, phase.value, min(end, now), util))
            self._emit(phase.value, run, why)

    def _say_once(self, msg: str) -> None:
        """A warning logged once per distinct message (a cluster down for an hour would
        otherwise log every tick)."""
        if msg not in self._said:
            self._said.add(msg)
            log.warning("%s", msg)

    def _flag_idle(self, run: Run, since: float, now: float) -> None:
        key = (run.id, run.attempt)
        if key in self._flagged_idle:
            return
        self._flagged_idle.add(key)
        t = self.rt.cfg.telemetry
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(since))
        why = f"its GPUs have been idle (under {t.idle_below_pct:g}% utilization) since {when}"
        why += "; stopping it" if t.stop_idle else "; wasting GPU time"
        if self.rt.store.flag(run.id, "idle", why, now=now):
            self._emit("idle", run, why)

    def _stop_cancelled(self, active: list[Run]) -> None:
        """Signal runs whose cancel was requested, and runs flagged for preemption that this
        process has not signalled (a scheduler that stopped between flag and signal: their
        preemptors wait for them to exit), and runs past a max runtime shortened after their
        launch (``overtime``). Once per attempt (``_signal``)."""
        for run in active:
            stop = run.cancel_requested or run.preempt_requested or overdue(run, self.clock())
            if stop and run.handle is not None:
                self._signal(run, run.spec.checkpoint.signal, run.spec.checkpoint.grace_s)

    def _signal(self, run: Run, signal: str, grace_s: float) -> None:
        key = (run.id, run.attempt)
        if key in self._signalled or run.handle is None or run.placement is None:
            return
        backend: Backend = self.rt.backends[run.placement.backend]
        try:
            backend.cancel(run.handle, signal, grace_s)
        except HandleError as e:
            self._emit("signal_failed", run, str(e))
        self._signalled.add(key)

    # -- the daemon -----------------------------------------------------------------------
    def run_forever(
        self,
        *,
        tick_s: float | None = None,
        idle_exit_s: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        after_tick: Callable[[TickReport], None] | None = None,
    ) -> None:
        """Reconcile, then tick until ``should_stop`` or (if set) idle for ``idle_exit_s``:
        nothing active and nothing pending but runs that are ``invalid`` under the config
        (they wait for a config that names their project or class; the next submit or
        ``mlops-gpu scheduler`` starts a scheduler that reads it). ``after_tick``: called
        after each tick (the daemon's heartbeat and config reload)."""
        tick_s = tick_s or self.rt.cfg.scheduler.tick_s
        wake_s = self.rt.cfg.scheduler.wake_s
        self.min_poll_gap_s = tick_s / 2 if wake_s > 0 else 0.0
        self.reconcile()
        idle_since: float | None = None
        while not should_stop():
            t0 = time.monotonic()
            self.warm()  # (cheap when warm; keeps watches going while idle)
            try:
                rep = self.tick()
            except ConflictError as e:  # a concurrent user change; the next tick sees it
                log.warning("tick conflict: %s", e)
                rep = TickReport(pending=1)
            if after_tick is not None:
                after_tick(rep)
            if rep.pending > rep.invalid or rep.active:
                idle_since = None
            elif idle_exit_s is not None:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= idle_exit_s:
                    left = f"; {rep.invalid} invalid runs wait" if rep.invalid else ""
                    log.info("idle for %.0fs: exiting%s", idle_exit_s, left)
                    return
            self._wait(t0 + tick_s, wake_s, should_stop)

    def _wait(self, until: float, wake_s: float, should_stop: Callable[[], bool]) -> None:
        """Sleep until ``until``, or less: until the store revision moves past the one this tick
        left (a submit or a cancel from another process), checked every ``wake_s``."""
        if wake_s <= 0:
            time.sleep(max(0.0, until - time.monotonic()))
            return
        rev = self.rt.store.revision()
        while (left := until - time.monotonic()) > 0 and not should_stop():
            time.sleep(min(wake_s, left))
            if self.rt.store.revision() != rev:
                return
