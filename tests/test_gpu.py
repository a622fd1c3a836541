"""On a machine with an NVIDIA GPU: a CUDA matmul run through ``mlops-gpu exec`` logs non-zero
utilization and memory for its device into its MLflow run. Skips only where no NVIDIA GPU is
found (NVML cannot start, or counts none)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlops_gpu.tracking.rest import MlflowRest


def gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU on this machine"),
]


@pytest.mark.mlflow_server
def test_a_cuda_matmul_shows_utilization_and_memory_in_mlflow(mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    rest = MlflowRest(mlflow_server)
    run_id = rest.create_run(rest.experiment_id("gpu-test"), "matmul")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
           "MLFLOW_TRACKING_URI": mlflow_server}  # fmt: skip
    env.pop("MLOPS_GPU_NVML", None)
    script = Path(__file__).with_name("gpu_matmul.py")
    proc = subprocess.run(
        [sys.executable, "-m", "mlops_gpu.cli.main", "exec", "--run-id", run_id,
         "--interval", "0.5", "--", sys.executable, str(script), "6"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok:" in proc.stdout
    client = MlflowClient(mlflow_server)
    util = client.get_metric_history(run_id, "system/gpu_0_utilization_percentage")
    mem = client.get_metric_history(run_id, "system/gpu_0_memory_usage_megabytes")
    assert len(util) >= 3 and max(m.value for m in util) > 0
    assert max(m.value for m in mem) > 0
    metrics = client.get_run(run_id).data.metrics
    assert metrics["mlops_gpu.mean_gpu_utilization"] > 0
