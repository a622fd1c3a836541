"""``Timelines``: the expected ends of the active runs on each node, for the EASY reservation
(``backfill.reserve``) and the estimated start times. ``State`` is a ``Timelines``; it books
each active run's end (``_timeline``) as it is built from a snapshot, and they do not change
during the cycle.

Invariants:
- ``ends[node]`` lists, sorted, (end, GPUs, run id) for every whole-GPU slot of an active run
  with a fixed expected end (start + ``max_runtime``); ``moving_ends[node]`` maps run id ->
  (seconds after now, GPUs) for ends that move with the clock (a run with ``max_runtime``
  but neither start nor admission time). ``lines(node, now)`` equals
  ``backfill._timelines`` for that node.
- ``_reached[node][(free, need)]`` caches ``reach_fixed`` (the walk over the node's fixed
  ends, unclamped): the ends do not change once built.
"""

from __future__ import annotations

import math
from collections import defaultdict

from mlops_gpu.core.backfill import reach_on, start_of
from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Run


class Timelines:
    """The nodes' timelines of expected ends; ``template`` and ``cap`` are the ``State``'s."""

    template: Snapshot
    cap: Capacity

    def __init__(self) -> None:
        self.ends: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
        self.moving_ends: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
        self._reached: dict[str, dict[tuple[int, int], tuple[int, float]]] = {}

    def _timeline(self, run: Run) -> None:
        """Book the run's expected end on its nodes, as ``backfill.expected_end`` computes it:
        fixed, or moving with the clock, or unknown (not booked). ``_sort_timelines`` sorts
        the fixed ends once every run is booked."""
        assert run.placement is not None
        mr = run.spec.max_runtime_s
        start = start_of(run)
        if mr is None:
            return
        for slot in run.placement.slots:
            if slot.fraction < 1.0 or slot.memory_mb is not None:
                continue
            n = len(slot.devices)
            if start is None:
                self.moving_ends[slot.node][run.id] = (mr, n)
            else:
                self.ends[slot.node].append((start + mr, n, run.id))

    def _sort_timelines(self) -> None:
        for line in self.ends.values():
            line.sort()

    def lines(self, node: str, now: float) -> list[tuple[float, int]]:
        """The node's (expected end, GPUs released) timeline at ``now``, sorted."""
        fixed = self.ends.get(node, ())
        out = [(e if e > now else now, n) for e, n, _ in fixed]
        moving = self.moving_ends.get(node)
        if moving:
            out.extend((now + off, n) for off, n in moving.values())
        if moving or (fixed and fixed[0][0] <= now):
            out.sort()  # moved ends, or overdue ends clamped to now, may tie out of order
        return out

    def reach(self, node: str, now: float, free: int, need: int) -> tuple[int, float]:
        """``backfill.reach_on(self.lines(node, now), free, need, now)`` without building the
        whole timeline: with no moving ends, ``reach_fixed``'s time clamped to ``now``."""
        if self.moving_ends.get(node):
            return reach_on(self.lines(node, now), free, need, now)
        got, when = self.reach_fixed(node, free, need)
        return got, (when if when > now else now)

    def reach_fixed(self, node: str, free: int, need: int) -> tuple[int, float]:
        """Walking the node's fixed ends in order, unclamped, from ``free`` GPUs free: the GPUs
        free and the end at which ``need`` are (or all it frees and its last end; -inf with no
        end). Clamping keeps the ends' order, so the end found is the one the clamped walk
        finds, and clamping it gives that walk's time. (Runs ending at the same moment may
        come in another order than ``lines`` sorts them, which changes neither when ``need``
        is reached nor whether it ever is.) It depends only on ``free``, ``need`` and the
        fixed ends, which do not change once built: a reservation and the ETAs ask the same of
        many nodes."""
        cache = self._reached.get(node)
        if cache is None:
            cache = self._reached[node] = {}
        found = cache.get((free, need))
        if found is None:
            got, when = free, -math.inf
            for e, n, _ in self.ends.get(node, ()):
                got, when = got + n, e
                if got >= need:
                    break
            found = cache[(free, need)] = (got, when)
        return found
