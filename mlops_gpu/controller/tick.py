"""One tick of the ``Controller``: store -> core decision -> backends -> store.

The controller reads the store through its change feed into a ``Mirror`` (live runs plus the
engine it keeps), so reading the store costs what changed since the last tick. One tick reads
the nodes (the backends' inventories, the pools' opened nodes), then:
1. poll: ask each backend, in one batched call, about every active run's job, and record what
   ended (succeeded, failed, cancelled, preempted -> requeued, lost -> requeued); after a
   requeue the nodes are read again (a lost job may mean a dead node);
2. stop: send the checkpoint signal to runs whose cancel was requested (once per process);
3. snapshot: catch up with the store's changes; nodes from the backends, the config, the usage
   ledger (fair share, budgets);
4. decide: one cycle of the engine (native, or the Python reference: the decision ``decide``
   makes on the snapshot);
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
(with a full re-read every ``loop.LEDGER_RELOAD_S``), so a tick does not re-read the history.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from mlops_gpu.backends import JobState
from mlops_gpu.controller import gate, launch, poll
from mlops_gpu.controller.snapshot import template, usage_inputs
from mlops_gpu.core.decision import ReasonCode
from mlops_gpu.model import Phase, Run
from mlops_gpu.state.jobs import cancel_doomed
from mlops_gpu.state.mlflow_notes import MlflowNote

if TYPE_CHECKING:
    from mlops_gpu.controller.loop import Controller
    from mlops_gpu.core import Snapshot

log = logging.getLogger("mlops_gpu.controller")

#: Queues up to this long are explained every tick (it costs a few milliseconds); longer ones
#: at most every ``scheduler.explain_s``.
EXPLAIN_EVERY_TICK_UP_TO = 1000


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


def _read(ctl: Controller) -> Snapshot:
    """The tick's template: config, nodes from the backends, and the powered-down nodes a boot
    was decided for offered to the core (``pools.open``)."""
    tmpl = template(ctl.rt, ctl.clock())
    if (opened := ctl.pools.open(tmpl.nodes, tmpl.now)) is not tmpl.nodes:
        tmpl = replace(tmpl, nodes=opened)
    return tmpl


def tick(ctl: Controller) -> TickReport:
    rep = TickReport()
    store, mirror = ctl.rt.store, ctl.mirror
    tmpl = _read(ctl)
    mirror.refresh(tmpl)
    if time.monotonic() - ctl._polled_at >= ctl.min_poll_gap_s:  # 1. poll
        ctl._polled_at = time.monotonic()
        poll.poll(ctl, mirror.active(), rep)
        if rep.requeued:
            # A lost job may mean a dead node, which the nodes read above still list as
            # usable: read them again (the backend re-reads after a loss), or the core would
            # place the requeued run on that node again and its job wait there for good.
            tmpl = _read(ctl)
        mirror.refresh(tmpl)
    active = mirror.active()
    poll.stop_cancelled(ctl, active)  # 2. stop
    pending = mirror.pending()
    now = ctl.clock()  # 3. snapshot
    history, spent = usage_inputs(ctl.rt, replace(tmpl, now=now), active, ctl._ledger_rows)
    explain = (
        len(pending) <= EXPLAIN_EVERY_TICK_UP_TO
        or now - ctl._last_explain >= ctl.rt.cfg.scheduler.explain_s
    )
    by_id = dict(mirror.runs)
    t_decide = time.monotonic()
    decision = mirror.cycle(now, history, spent)  # 4. decide
    t_admit = time.monotonic()
    for pre in decision.preemptions:  # 5. preempt
        run = by_id[pre.run_id]
        lost = pre.lost_gpu_s  # (both engines fill it: the native tests compare them)
        store.mark_preempting(run.id, pre.reason, now=ctl.clock(), lost_gpu_s=lost)
        poll.send_stop(ctl, run, pre.signal, pre.grace_s)
        ctl._emit("preempting", run, f"{pre.reason}; loses {lost:.0f} GPU-s of work")
    if decision.doomed:  # dependencies that can never be met: cancelled with the reason
        cancel_doomed(store, [(p.run_id, p.reason) for p in decision.doomed], ctl.clock())
    launched: dict[str, dict[str, str]] = defaultdict(dict)  # backend -> handle -> run id
    fresh: list[Run] = []
    adms = decision.admissions  # 6. admit (one transaction), then launch
    oks = store.admit_many([(a.run_id, a.placement) for a in adms], now=ctl.clock(),
                           decided={a.run_id: by_id[a.run_id].spec for a in adms})  # fmt: skip
    for adm, ok in zip(adms, oks, strict=True):
        if ok:  # (False: cancelled or updated meanwhile)
            got = store.get(adm.run_id)
            assert got is not None and got.placement is not None
            fresh.append(got)
    going = gate.going_ids(active, (p.run_id for p in decision.preemptions))
    admitted, held = ctl.gate.split(fresh, active, going, now)
    handles: list[tuple[str, str]] = []
    t_launch = time.monotonic()
    started = launch.start_jobs(ctl, admitted)
    # Each attempt's MLflow run (Run.mlflow_run_id, the Prefect worker's link; and what a
    # start closes if the attempt ended unclosed): one transaction for the tick's launches
    store.note_mlflow([MlflowNote(r.id, r.attempt, "opened", m)
                       for r, (_, m) in zip(admitted, started, strict=True) if m is not None],
                      now=ctl.clock())  # fmt: skip
    for run, result in zip(admitted, started, strict=True):
        handle = launch.launched(ctl, run, result, rep)
        if handle is not None and run.placement is not None:
            launched[run.placement.backend][handle] = run.id
            handles.append((run.id, handle))
    store.set_handles(handles, Phase.STARTING, now=ctl.clock())
    if admitted:  # where a busy tick's time goes (ms)
        t_end = time.monotonic()
        log.info("tick: %d admitted of %d pending; decide %.0f, admit %.0f, launch %.0f ms",
                 len(admitted), len(pending), 1000 * (t_admit - t_decide),
                 1000 * (t_launch - t_admit), 1000 * (t_end - t_launch))  # fmt: skip
    for bname, by_handle in launched.items():  # one batched poll: most starts are immediate
        backend = ctl.rt.backends[bname]
        if not backend.capabilities.starts_at_once:
            continue  # (its jobs take seconds to start: the next tick's poll sees them)
        sts = backend.poll(list(by_handle)).values()
        up = [by_handle[st.handle] for st in sts if st.state is JobState.RUNNING]
        store.mark_running_many(up, now=ctl.clock())
    if explain:  # 7. explain
        ctl._last_explain = now
        reasons = mirror.explain(now, history, spent)
        reasons = ctl.pools.explain(now, reasons, by_id, active, tmpl.nodes, spent)
        store.set_reasons([(p.run_id, p.reason_code.value, p.reason, p.eta) for p in reasons])
        rep.invalid = sum(p.reason_code is ReasonCode.INVALID for p in reasons)
    ctl._flush_tracking()
    rep.pending = len(pending) - len(decision.admissions)
    rep.active = len(active) + rep.admitted + held
    return rep
