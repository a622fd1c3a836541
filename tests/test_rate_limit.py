"""The API client's token bucket, on a fake clock."""

from __future__ import annotations

import threading

import pytest

from mlops_gpu.backends.rate_limit import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        with self.lock:
            self.t += s


def test_burst_passes_at_once_then_calls_are_spaced_by_one_over_qps() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, 5, clock=clock, sleep=clock.sleep)
    waits = [bucket.take() for _ in range(8)]
    assert waits[:5] == [0.0] * 5
    assert waits[5:] == pytest.approx([0.1, 0.1, 0.1])
    assert clock.t == pytest.approx(0.3)


def test_idle_time_refills_up_to_burst_only() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2, 3, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        bucket.take()
    clock.t += 100  # a long idle stretch refills 3 tokens, not 200
    assert [bucket.take() for _ in range(3)] == [0.0] * 3
    assert bucket.take() == pytest.approx(0.5)


def test_never_more_than_burst_plus_qps_times_t_under_threads() -> None:
    import time

    bucket = TokenBucket(200, 20)
    stamps: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(15):
            bucket.take()
            with lock:
                stamps.append(time.monotonic())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 120 calls: 20 at once, 100 more at 200/s take at least 0.5 s
    assert len(stamps) == 120
    assert max(stamps) - t0 >= 0.5 - 0.02


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 5), (10, 0)])
def test_bad_limits_are_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="qps must be > 0"):
        TokenBucket(qps, burst)
