"""A small clock-stepping driver for starvation tests: runs start, end at their true durations,
arrivals come, and an engine (the Python reference, from scratch, or native) decides each cycle.

``drive`` returns when the target started (None: not within the horizon) and the bound it must
start by once it holds the reservation (None when it never did): the time the runs holding
resources after the cycle in which it became the anchor have all ended (the runs that cycle
admitted too: a run that fit as the cycle began becomes the anchor at its end, once later runs
overtook it, ``anchor.overtaken``), counting a run with ``max_runtime`` as ending at its
max_runtime (EASY backfill lets later runs use GPUs until the reservation's time as those
max_runtimes set it), plus one cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mlops_gpu.core import Decision
from mlops_gpu.model import Run


class Engine(Protocol):
    active: Any

    def submit(self, run: Run) -> None: ...
    def finish(self, run_id: str) -> Run: ...
    def cycle(self, now: float) -> Decision: ...
    def kept_anchor(self) -> str | None: ...


@dataclass
class Outcome:
    started: float | None
    bound: float | None
    overtaken: int  # runs submitted after the target that started before it


def drive(
    engine: Engine,
    holders: list[tuple[Run, float]],
    target: Run,
    arrivals: Callable[[int, float], list[tuple[Run, float]]],
    *,
    dt: float = 1.0,
    horizon: float = 300.0,
) -> Outcome:
    """``holders`` (run, true duration) are submitted and admitted at t=0; ``target`` is
    submitted after that first cycle; ``arrivals(step, now)`` gives the runs submitted at each
    later step (with their true durations). Runs end at start + true duration (a run's
    max_runtime, where it has one, must not be shorter: it would have been stopped then)."""
    duration: dict[str, float] = {}
    started: dict[str, float] = {}
    for r, d in holders:
        engine.submit(r)
        duration[r.id] = d
    now = 0.0
    for a in engine.cycle(now).admissions:
        started[a.run_id] = now
    engine.submit(target)
    bound: float | None = None
    after_target: set[str] = set()
    overtaken, step = 0, 0
    while now < horizon:
        step += 1
        now = step * dt
        for rid, at in list(started.items()):
            if rid in engine.active and at + duration[rid] <= now + 1e-9:
                engine.finish(rid)
                del started[rid]
        for r, d in arrivals(step, now):
            engine.submit(r)
            duration[r.id] = d
            after_target.add(r.id)
        d = engine.cycle(now)
        for a in d.admissions:
            started[a.run_id] = now
            if a.run_id == target.id:
                return Outcome(now, bound, overtaken)
            overtaken += a.run_id in after_target
        kept = getattr(engine, "kept_anchor", lambda: None)()  # (main's engines: none)
        if bound is None and kept == target.id:
            # it became the anchor in this cycle: when what holds resources now has ended
            bound = _held_until(engine, started, duration, now) + dt
    return Outcome(None, bound, overtaken)


def _held_until(
    engine: Engine, started: dict[str, float], duration: dict[str, float], now: float
) -> float:
    """When the runs active after this cycle's admissions have all ended (by max_runtime where
    they have one and it is longer than their true duration)."""
    ends = []
    for rid, at in started.items():
        mr = engine.active[rid].spec.max_runtime_s
        ends.append(at + (duration[rid] if mr is None else max(mr, duration[rid])))
    return max(ends, default=now)
