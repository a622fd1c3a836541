"""Issue 24, item 2, first bullet, end to end on the local backend (SDK, a real scheduler,
virtual GPUs): runs that are not preemptible do not borrow, so a lender that wants its nominal
quota gets it at once (on main it waited, nothing preempted, its reason not saying why)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import stop_scheduler

import mlops_gpu as mg
from mlops_gpu.testing import config_yaml

pytestmark = pytest.mark.slow


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[Path]:
    # 4 virtual GPUs; b and l own 2 each and may borrow the other's idle ones
    data = yaml.safe_load(config_yaml(projects={"b": (2, None), "l": (2, None)}))
    data["scheduler"] = {"tick_s": 0.1, "idle_exit_s": 10}
    p = tmp_path / "mlops-gpu.yaml"
    p.write_text(yaml.safe_dump(data))
    yield p
    stop_scheduler(p)


def _until(check: object, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not check():  # type: ignore[operator]
        assert time.time() < deadline, what()  # type: ignore[operator]
        time.sleep(0.1)


def test_a_lender_gets_its_quota_at_once_when_the_others_are_not_preemptible(cfg: Path) -> None:
    b = [
        mg.submit(["sleep", "120"], project="b", gpus=1, preemptible=False, config=cfg)
        for _ in range(4)
    ]
    _until(
        lambda: (
            sum(r.status in ("admitted", "starting", "running") for r in b) == 2
            and all(r.reason for r in b if r.status == "pending")
        ),
        60,
        lambda: [(r.status, r.reason) for r in b],
    )
    time.sleep(1.0)  # a few more cycles: still only its nominal quota
    assert sum(r.status == "pending" for r in b) == 2
    waiting = next(r for r in b if r.status == "pending")
    assert "run is not preemptible: it may use only project b's nominal quota" in (
        waiting.reason or ""
    ), waiting.reason
    lender = mg.submit(["sleep", "1"], project="l", gpus=2, config=cfg)
    t0 = time.time()
    assert lender.wait(timeout=60) == "succeeded"
    assert time.time() - t0 < 20  # on main: pending past 60 s, 0 preemptions
    for r in b:
        r.cancel()
