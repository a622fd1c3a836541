"""The ``mlops-gpu`` worker's CPU-only runs: job variables ``gpus: 0`` with ``cpu`` (millicores)
and ``memory`` (MB) become a CPU-only scheduled run; ``gpus: 0`` alone asks for one core (the
core refuses a run that asks for nothing)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import stop_scheduler
from mlops_gpu_prefect.worker import MlopsGpuJobConfiguration, MlopsGpuVariables, _submit

from .conftest import mlops_config


@pytest.mark.parametrize(("variables", "expected"), [
    ({"cpu": 2000, "memory": 512}, (2000, 512)),
    ({}, (1000, 0)),
])  # fmt: skip
def test_gpus_zero_is_a_cpu_only_run_of_the_job_variables(
    tmp_path: Path, variables: dict[str, int], expected: tuple[int, int]
) -> None:
    assert {"cpu", "memory"} <= set(MlopsGpuVariables.model_json_schema()["properties"])
    cfg = mlops_config(tmp_path, {"p": (2, 0)})
    conf = MlopsGpuJobConfiguration(project="p", gpus=0, config=str(cfg), command="true",
                                    **variables)  # fmt: skip
    try:
        run = _submit(SimpleNamespace(name="cpu-flow"), conf)  # type: ignore[arg-type]
        req = run.record.spec.request
        assert (req.gpus, req.cpu_milli, req.host_memory_mb) == (0, *expected)
        assert run.wait(timeout=120) == "succeeded"  # `true` ran as a CPU-only run
    finally:
        stop_scheduler(cfg)
