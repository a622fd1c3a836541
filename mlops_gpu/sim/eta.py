"""ETA accuracy: what the core told a waiting run about its start, against when it started.

Recording (``EtaLog``, fed by the simulator, which asks the engine's ``explain_all`` as the
controller does after a tick): a run *waits* when the cycles at its submission time leave it
pending; that moment is its first pending cycle (``pending_at``). The log keeps the ETA the
explanation gave it then (None: it gave none), and one sample (time, ETA) at the first cycle at
or after every simulated hour boundary (``SAMPLE_S``) while it waits. A run leaves the log's
waiting set at its first start; requeues after a preemption are not waits here.

Metrics (``eta_metrics``) read only the log and the real first starts, never how the ETAs were
computed:
- ``eta_coverage``: share of the waiting runs that had an ETA at their first pending cycle;
- ``eta_on_time``: share of those that started no later than that ETA + ``ON_TIME_S``;
- ``eta_median_rel_err``: median, over the runs with an ETA, of
  ``|start - ETA| / max(ETA - pending_at, ON_TIME_S)``. The predicted wait is floored at the
  on-time tolerance: an ETA of "now" (ETA == pending_at) is judged against a one-minute wait
  instead of dividing by zero, so a run told "now" that starts within a minute scores <= 1;
- ``eta_median_wait_ratio``: median of (real wait) / (predicted wait), each floored at
  ``ON_TIME_S``: below 1, the ETA is pessimistic (the run started earlier than told);
- ``eta_hourly_median_rel_err``: the same error as ``eta_median_rel_err`` over every hourly
  sample (measured from the sample's time), so one sees whether ETAs sharpen while runs wait.
A run that never started counts as late and is left out of the medians. With no waiting run
(or no ETA), the shares and medians are None.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Protocol

ON_TIME_S = 60.0
SAMPLE_S = 3600.0


class _Reason(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def eta(self) -> float | None: ...


@dataclass
class EtaRecord:
    pending_at: float
    first_eta: float | None
    #: (time, ETA then) at the first cycle at or after each simulated hour while it waits
    samples: list[tuple[float, float | None]] = field(default_factory=list)


class EtaLog:
    """What the simulator records: per waiting run, its first ETA and its hourly samples."""

    def __init__(self) -> None:
        self.records: dict[str, EtaRecord] = {}
        self.waiting: set[str] = set()
        self.next_sample: float | None = None

    def due(self, now: float, new: Collection[str]) -> bool:
        """Whether the cycle at ``now`` must be explained: runs became waiting, or an hour
        boundary passed while runs wait."""
        if new:
            return True
        return bool(self.waiting) and self.next_sample is not None and now >= self.next_sample

    def record(self, now: float, new: Iterable[str], reasons: Iterable[_Reason]) -> None:
        """The explanation at ``now``: first ETAs for ``new`` runs, samples for the others."""
        eta = {r.run_id: r.eta for r in reasons}
        sample = self.next_sample is not None and now >= self.next_sample
        if sample:
            for rid in self.waiting:
                self.records[rid].samples.append((now, eta.get(rid)))
        for rid in new:
            self.records[rid] = EtaRecord(now, eta.get(rid))
            self.waiting.add(rid)
        if self.next_sample is None or sample:
            self.next_sample = (now // SAMPLE_S + 1) * SAMPLE_S

    def started(self, run_id: str) -> None:
        self.waiting.discard(run_id)


def _rel(start: float, eta: float, at: float) -> float:
    return abs(start - eta) / max(eta - at, ON_TIME_S)


def eta_metrics(
    records: Mapping[str, EtaRecord], starts: Mapping[str, float | None]
) -> dict[str, float | int | None]:
    """The ETA keys of a ``simulate --json`` row from the log and each run's first start."""
    with_eta = [(rid, r) for rid, r in records.items() if r.first_eta is not None]
    on_time = 0
    errs: list[float] = []
    ratios: list[float] = []
    hourly: list[float] = []
    for rid, r in with_eta:
        start, eta = starts.get(rid), r.first_eta
        assert eta is not None
        if start is None:
            continue  # never started: late, and no error to measure
        on_time += start <= eta + ON_TIME_S
        errs.append(_rel(start, eta, r.pending_at))
        ratios.append(max(start - r.pending_at, ON_TIME_S) / max(eta - r.pending_at, ON_TIME_S))
    for rid, r in records.items():
        start = starts.get(rid)
        if start is None:
            continue
        hourly.extend(_rel(start, e, t) for t, e in r.samples if e is not None)
    n, k = len(records), len(with_eta)
    return {
        "eta_waiting": n,
        "eta_coverage": k / n if n else None,
        "eta_on_time": on_time / k if k else None,
        "eta_median_rel_err": median(errs) if errs else None,
        "eta_median_wait_ratio": median(ratios) if ratios else None,
        "eta_hourly_median_rel_err": median(hourly) if hourly else None,
    }
