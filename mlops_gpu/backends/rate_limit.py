"""A token bucket for a backend's API client: at most ``burst`` calls at once, refilled at
``qps`` a second (client-go's ``--kube-api-qps``/``--kube-api-burst``).

Invariant: over any interval of length ``t`` at most ``burst + qps * t`` calls pass ``take``.
Thread-safe (the controller launches from several threads); the clock and sleep are injected
so the arithmetic is tested without waiting. One bucket per backend covers all its calls
(launches, polls, the elastic pools' placeholders): the bound is what the API server is
promised, so no caller gets a budget of its own (``k8s_capacity`` says why its calls cannot
starve launches).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"qps must be > 0 and burst >= 1, got qps={qps}, burst={burst}")
        self.qps, self.burst = float(qps), int(burst)
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Wait for a token; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1  # reserve it now: later callers queue behind this one
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
        if wait > 0:
            self._sleep(wait)
        return wait
