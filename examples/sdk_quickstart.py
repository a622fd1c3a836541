"""Submit runs from Python (a notebook works the same way) and watch them.

    python examples/sdk_quickstart.py --config mlops-gpu-demo/mlops-gpu.yaml

Without --config the config is found as the CLI finds it; with none anywhere, a per-user
starter is written (virtual GPUs when NVML finds none). A background scheduler is started on
submit and exits by itself when idle.
"""

from __future__ import annotations

import argparse
import sys

import mlops_gpu as mg


def train(epochs: int, lr: float) -> dict[str, float]:
    """A stand-in for a training function: runs inside the job, on the run's GPUs."""
    import os

    loss = 1.0
    for _ in range(epochs):
        loss *= 1 - lr
    return {"loss": loss, "devices": float(len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None)
    ap.add_argument("--project", default="vision")
    args = ap.parse_args()

    fn_run = mg.submit(train, project=args.project, gpus=2, args=(10, 0.1), config=args.config)
    cmd_run = mg.submit(
        [sys.executable, "-c", "import os; print('devices', os.environ['CUDA_VISIBLE_DEVICES'])"],
        project=args.project,
        gpus=1,
        config=args.config,
    )
    print(fn_run, cmd_run)
    print("result:", fn_run.result(timeout=300))
    cmd_run.wait(timeout=300)
    print("logs:", cmd_run.logs().strip())
    print("info:", {k: cmd_run.info()[k] for k in ("phase", "node_names", "devices", "reason")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
