"""The earliest nodes for an EASY reservation, without walking every node's timeline each cycle.

``backfill.reserve`` needs, per GPU type and backend, the ``nodes`` nodes that first have a
run's GPUs per node free: for each eligible node, ``now`` if it has them free, else the
expected end (``State.reach``, clamped to ``now``) at which its timeline frees enough, or never.
One ``Index`` per (GPU type, pinned backend, gang or not, GPUs per node) keeps the eligible
nodes sorted by that time *unclamped*, and follows ``Capacity.changes`` (the log of nodes whose
free devices or expected ends changed) to re-sort only those. Clamping to ``now`` keeps the
order of times after ``now`` and makes every time at or before it equal, so the earliest nodes
are the ones at or before ``now`` (by name) and then the sorted ones after it.

Invariants:
- an index holds one entry per eligible node with a fixed timeline that can ever free enough,
  at its unclamped time (-inf when enough are free now), as of ``Capacity.changes`` up to
  ``pos``; nodes with ends that move with the clock (runs being preempted) are ``volatile``
  and worked out at each read;
- it serves only eligibility that does not depend on the run beyond what its key names: no
  host resources requested, whole GPUs, and the eligible nodes of one backend (``State.
  earliest`` returns None otherwise, and the reservation walks the nodes as before);
- when the log was cut short past ``pos`` (it is bounded), the index is built again.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlops_gpu.core.timelines import Timelines


class Index:
    def __init__(self, names: list[str], need: int) -> None:
        self.names = set(names)
        self.need = need
        self.pos = -1  # absolute position in ``Capacity.changes`` read up to (-1: build)
        self.order: list[tuple[float, str]] = []  # (unclamped time, node), sorted
        self.at: dict[str, float] = {}  # node -> its time in ``order``
        self.volatile: set[str] = set()

    def _build(self, st: Timelines) -> None:
        self.order, self.at, self.volatile = [], {}, set()
        for name in self.names:
            when = self._time(st, name)
            if when is not None:
                self.order.append((when, name))
        self.order.sort()

    def _refresh(self, st: Timelines, name: str) -> None:
        old = self.at.pop(name, None)
        if old is not None:
            del self.order[bisect_left(self.order, (old, name))]
        self.volatile.discard(name)
        when = self._time(st, name)
        if when is not None:
            insort(self.order, (when, name))

    def _time(self, st: Timelines, name: str) -> float | None:
        """The node's unclamped time, recorded in ``at`` (None: never, or volatile)."""
        if st.moving_ends.get(name):
            self.volatile.add(name)
            return None
        free = len(st.cap.free[name])
        if free >= self.need:
            when = -math.inf
        else:
            got, when = st.reach_fixed(name, free, self.need)
            if got < self.need:
                return None
        self.at[name] = when
        return when

    def earliest(self, st: Timelines, now: float, k: int) -> list[tuple[float, str]]:
        """The ``k`` earliest (time clamped to ``now``, node), fewer when fewer ever fit."""
        cap = st.cap
        if self.pos < cap.changes_base:
            self._build(st)
        else:
            changed = cap.changes[self.pos - cap.changes_base :]
            for name in set(changed) & self.names if changed else ():
                self._refresh(st, name)
        self.pos = cap.changes_base + len(cap.changes)
        out: list[tuple[float, str]] = []
        i, order = 0, self.order
        while i < len(order) and order[i][0] <= now:
            out.append((now, order[i][1]))
            i += 1
        out.extend(order[i : i + k])
        for name in self.volatile:
            free = len(cap.free[name])
            if free >= self.need:
                out.append((now, name))
                continue
            got, when = st.reach(name, now, free, self.need)
            if got >= self.need:
                out.append((when, name))
        out.sort()
        return out[:k]
