"""A small training job for the example MLflow project: least-squares regression by gradient
descent in numpy, logging its loss per epoch to the MLflow run the scheduler attached it to
(``MLFLOW_RUN_ID``), and printing the GPUs it was given."""

from __future__ import annotations

import argparse
import os

import mlflow
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()
    print(f"devices CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8))
    w_true = rng.normal(size=8)
    y = x @ w_true + 0.01 * rng.normal(size=512)
    w = np.zeros(8)
    with mlflow.start_run():  # resumes the run in MLFLOW_RUN_ID
        for epoch in range(args.epochs):
            grad = x.T @ (x @ w - y) / len(y)
            w -= args.lr * grad
            loss = float(np.mean((x @ w - y) ** 2))
            mlflow.log_metric("loss", loss, step=epoch)
            print(f"epoch {epoch + 1}/{args.epochs} loss={loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
