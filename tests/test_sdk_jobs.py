"""The SDK's job control: ``mg.map`` (a job array with a limit), ``mg.submit_many`` (one
transaction) and dependencies, holds and begin times on ``mg.submit``, with the background
scheduler on the local backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import stop_scheduler

import mlops_gpu as mg
from mlops_gpu.controller import SubmitError
from mlops_gpu.testing import config_yaml


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[Path]:
    p = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml())
    data["scheduler"] = {"tick_s": 0.1, "idle_exit_s": 3}
    data["mlflow"] = {"enabled": False}
    p.write_text(yaml.safe_dump(data))
    yield p
    stop_scheduler(p)


def square(x: int) -> int:
    return x * x


def test_map_is_an_array_with_a_limit(cfg: Path) -> None:
    runs = mg.map(square, range(5), project="p", limit=2, config=cfg)
    aid = runs[0].record.spec.array_id
    assert aid is not None and [r.id for r in runs] == [f"{aid}_{i}" for i in range(5)]
    assert {r.record.spec.array_limit for r in runs} == {2}
    assert [r.result(timeout=120) for r in runs] == [0, 1, 4, 9, 16]


def test_submit_many_with_a_dependency_and_a_hold(cfg: Path) -> None:
    first = mg.submit("true", project="p", config=cfg, start_scheduler=False)
    runs = mg.submit_many(
        [
            {"target": "true", "project": "p", "config": cfg, "afterok": first},
            {"target": "sh -c 'exit 1'", "project": "p", "config": cfg},
        ],
        hold=True,
        start_scheduler=False,
    )
    assert [r.record.held for r in runs] == [True, True]
    assert [d.run_id for d in runs[0].record.spec.dependencies] == [first.id]
    assert runs[0].release() == "released"
    assert runs[1].cancel() == "cancelled"
    stopped = mg.submit("true", project="p", config=cfg, afternotok=[runs[1]])
    assert first.wait(timeout=60) == "succeeded"
    assert runs[0].wait(timeout=60) == "succeeded"
    assert stopped.wait(timeout=60) == "succeeded"  # afternotok: a cancel counts as not ok


def test_bad_job_requests_queue_nothing(cfg: Path) -> None:
    with pytest.raises(SubmitError, match="dependency on unknown run id 'rdeadbeef00'"):
        mg.submit("true", project="p", config=cfg, afterok="rdeadbeef00", start_scheduler=False)
    with pytest.raises(SubmitError, match="--begin: expected"):
        mg.submit("true", project="p", config=cfg, begin="soon", start_scheduler=False)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        mg.map(square, [1], project="p", limit=0, config=cfg)
    with pytest.raises(SubmitError, match="unknown project"):
        mg.submit_many([{"target": "true", "project": "nope", "config": cfg}],
                       start_scheduler=False)  # fmt: skip
    from mlops_gpu.config import load_config
    from mlops_gpu.controller import Runtime

    assert Runtime(load_config(str(cfg))).store.count() == 0
