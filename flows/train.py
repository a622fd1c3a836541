"""A training flow: least-squares regression by gradient descent in numpy, logged to MLflow.

Deployed to an ``mlops-gpu`` work pool (``prefect.yaml``), each run is a scheduled run: it waits
for its GPUs under its project's quota, and the scheduler hands it the attempt's MLflow run
(``MLFLOW_RUN_ID``), so ``mlflow.start_run()`` here logs beside the scheduler's tags, queue wait
and cost. Run by hand, it logs to a new MLflow run of the current tracking URI.
"""

from __future__ import annotations

import os

import mlflow
import numpy as np
from prefect import flow


@flow(log_prints=True)
def train(epochs: int = 20, lr: float = 0.1, seed: int = 0) -> float:
    """Fit ``y = Xw`` on synthetic data; returns the final mean squared error."""
    print(f"devices CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1024, 16))
    y = x @ rng.normal(size=16) + 0.01 * rng.normal(size=1024)
    w = np.zeros(16)
    loss = float("nan")
    with mlflow.start_run():
        mlflow.log_params({"epochs": epochs, "lr": lr, "seed": seed})
        for epoch in range(epochs):
            w -= lr * x.T @ (x @ w - y) / len(y)
            loss = float(np.mean((x @ w - y) ** 2))
            mlflow.log_metric("loss", loss, step=epoch)
        print(f"final loss {loss:.5f} after {epochs} epochs")
    return loss


if __name__ == "__main__":
    train()
