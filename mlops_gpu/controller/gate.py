"""Launch gating: an admitted run starts only once the devices it was placed on are free of jobs.

The core admits a preemptor in the same decision that preempts its victims, on the devices they
free, and from then on counts those devices as the preemptor's (no other run can take them). The
victims' jobs still run for up to their grace period (checkpoint signal, then SIGKILL). The
controller launches the preemptor only once no live job of the store holds any of its devices;
until then the run stays ``admitted`` without a handle, holding its placement, with the reason
``waiting for preempted run(s) ... to exit``.

Invariants:
- A device (backend, node, device id) is used by at most one job at a time where it is not
  shared: ``blockers`` returns every run with a job (a handle) on a device of the run's placement
  that is being preempted (the core no longer counts what it holds), or that holds it whole.
  Runs sharing a time-sliced device with the run and not being preempted (a cancelled run
  still counts in the core until it exits) are the core's legitimate sharing, not blockers.
- Only runs with a job block: an admission not yet launched (a handle-less ``admitted`` run)
  holds devices in the core but never blocks another launch, so two waiting runs cannot wait
  on each other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from mlops_gpu.model import Phase, Run
from mlops_gpu.state import Store


def _devices(run: Run) -> dict[tuple[str, str, str], float]:
    """(backend, node, device id) -> the share of it the run holds."""
    p = run.placement
    if p is None:
        return {}
    return {(p.backend, s.node, d): s.fraction for s in p.slots for d in s.devices}


def blockers(run: Run, holders: Iterable[Run], going: Collection[str]) -> list[Run]:
    """The runs with a live job on a device of ``run``'s placement that ``run`` must wait for
    (see the module's invariants); ``going``: ids of the runs being preempted."""
    mine = _devices(run)
    out: list[Run] = []
    for h in holders:
        if h.id == run.id or h.handle is None:
            continue
        for key, share in _devices(h).items():
            if key in mine and (h.id in going or (share >= 1.0 and mine[key] >= 1.0)):
                out.append(h)
                break
    return out


def going_ids(active: Iterable[Run], marked: Iterable[str] = ()) -> set[str]:
    """Runs being preempted: the store's flag, plus ``marked`` (victims flagged this tick,
    whose copies predate the flag)."""
    return {r.id for r in active if r.preempt_requested} | set(marked)


def waiting_reason(blocking: list[Run]) -> str:
    ids = ", ".join(r.id for r in blocking[:5]) + (", ..." if len(blocking) > 5 else "")
    grace = max(r.spec.checkpoint.grace_s for r in blocking)
    return f"waiting for preempted run(s) {ids} to exit (grace up to {grace:g} s)"


class Gate:
    """The controller's admitted runs held back (run id -> the ETA said when it began to wait):
    ``split`` each tick, ``hold`` for a waiting admission found at start-up."""

    def __init__(
        self, store: Store, clock: Callable[[], float], emit: Callable[[str, Run, str], None]
    ) -> None:
        self.store, self.clock, self.emit = store, clock, emit
        self.waiting: dict[str, float | None] = {}

    def hold(self, run_id: str) -> None:
        self.waiting[run_id] = None

    def split(
        self, fresh: list[Run], active: list[Run], going: set[str], now: float
    ) -> tuple[list[Run], int]:
        """(the admitted runs to launch now, how many of this tick's admissions wait): this
        tick's admissions (``fresh``) and those that waited before, less those whose devices a
        job still holds, which stay admitted with their reason. A waiting run whose cancel was
        requested ends cancelled (it never ran)."""
        carried: list[Run] = []
        for run in active:
            if run.phase is not Phase.ADMITTED or run.handle is not None:
                continue
            if run.id not in self.waiting:
                continue  # (a launch this process began: the start-up reconcile repairs it)
            if run.cancel_requested:
                self.waiting.pop(run.id, None)
                why = "cancelled while waiting for its devices"
                if self.store.rollback_admission(run.id, why, now=self.clock()) is Phase.CANCELLED:
                    self.emit("cancelled", run, why)
                continue
            carried.append(run)
        self.waiting = {r.id: self.waiting[r.id] for r in carried}  # (the rest moved on)
        go: list[Run] = []
        wait: list[tuple[str, str, float | None]] = []
        held = 0
        for run in [*carried, *fresh]:
            blocking = blockers(run, active, going)
            if not blocking:
                self.waiting.pop(run.id, None)
                go.append(run)
                continue
            why = waiting_reason(blocking)
            if run.id not in self.waiting:
                held += 1
                self.waiting[run.id] = now + max(b.spec.checkpoint.grace_s for b in blocking)
                self.emit("waiting", run, why)
            wait.append((run.id, why, self.waiting[run.id]))
        self.store.set_waiting(wait, now=self.clock())
        return go, held
