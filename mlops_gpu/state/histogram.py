"""Cumulative histograms as Prometheus keeps them (``Histogram``), and the bucket bounds of the
two the store serves: the scheduler's cycle latency and the admission wait.

Invariant: ``buckets[i]`` counts the observations ``<= bounds[i]`` (cumulative); ``count``
counts them all (the implied ``+Inf`` bucket)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Upper bounds (seconds) of the scheduler cycle histogram's buckets (+Inf implied).
CYCLE_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Upper bounds (seconds) of the admission wait histogram's buckets (+Inf implied).
WAIT_BUCKETS: tuple[float, ...] = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    21600.0,
    86400.0,
)


@dataclass
class Histogram:
    """Cumulative bucket counts (one per bound, in order), the total count and the sum."""

    bounds: tuple[float, ...]
    buckets: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [0] * len(self.bounds)

    def observe(self, value: float, n: int = 1) -> None:
        self.count += n
        self.sum += value * n
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.buckets[i] += n

    def observe_many(self, values: Iterable[float]) -> None:
        """``observe`` each value (one pass per bucket, not per value and bucket)."""
        per = [0] * (len(self.bounds) + 1)
        for v in values:
            per[bisect_left(self.bounds, v)] += 1
            self.sum += v
        self.count += sum(per)
        run = 0
        for i in range(len(self.bounds)):
            run += per[i]
            self.buckets[i] += run

    def merge(self, other: Histogram) -> None:
        self.count += other.count
        self.sum += other.sum
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
