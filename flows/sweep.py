"""A hyperparameter sweep as a flow: ``mg.sweep`` on Optuna over the training problem of
``train.py``, every trial a scheduled run of ``gpus_per_trial`` GPUs under one MLflow parent run.

The sweep grows onto idle GPUs its project may borrow, and its borrowed trials are the first the
scheduler takes back when their owner needs them (they rerun). The flow ends with a Markdown
artifact of the trials and returns the best parameters and value.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from prefect import flow

#: lr on a log scale, an L2 penalty, and the number of epochs
SPACE: dict[str, Any] = {"lr": ("log", 1e-3, 0.5), "l2": (0.0, 0.1), "epochs": (5, 40)}


def objective(params: dict[str, Any]) -> dict[str, float]:
    """Train the least-squares model of ``train.py`` (inside the trial's run); its losses."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 16))
    y = x @ rng.normal(size=16) + 0.01 * rng.normal(size=1024)
    xv, yv = x[768:], y[768:]
    x, y = x[:768], y[:768]
    w = np.zeros(16)
    for _ in range(int(params["epochs"])):
        w -= params["lr"] * (x.T @ (x @ w - y) / len(y) + params["l2"] * w)
    return {"loss": float(np.mean((xv @ w - yv) ** 2)),
            "train_loss": float(np.mean((x @ w - y) ** 2))}  # fmt: skip


@flow(log_prints=True)
def sweep(
    trials: int = 8,
    project: str = "default",
    gpus_per_trial: int = 1,
    max_parallel: int | None = None,
    seed: int | None = 0,
    config: str | None = None,
) -> dict[str, Any]:
    import cloudpickle
    from prefect.artifacts import create_markdown_artifact

    import mlops_gpu as mg

    # Prefect loads this file under a generated module name the trials' jobs cannot import:
    # send the objective by value.
    module = sys.modules.get(objective.__module__)
    if module is not None and module.__name__ != "__main__":
        cloudpickle.register_pickle_by_value(module)
    sw = mg.sweep(objective, SPACE, trials=trials, project=project,
                  gpus_per_trial=gpus_per_trial, max_parallel=max_parallel, seed=seed,
                  config=config, name="flows-sweep").wait()  # fmt: skip
    lines = ["| trial | run | lr | l2 | epochs | loss |", "| --- | --- | --- | --- | --- | --- |"]
    for t in sw.trials:
        p = t.params
        value = "failed" if t.value is None else f"{t.value:.5f}"
        lines.append(f"| {t.number} | {t.run.id} | {p['lr']:.4g} | {p['l2']:.3g} "
                     f"| {p['epochs']} | {value} |")  # fmt: skip
    create_markdown_artifact("\n".join(lines), key="sweep-trials",
                             description=f"MLflow parent run {sw.parent_run_id}")  # fmt: skip
    print(f"best loss {sw.best_value:.5f} with {sw.best_params}")
    return {"best_value": sw.best_value, "best_params": sw.best_params,
            "parent_run_id": sw.parent_run_id}  # fmt: skip


if __name__ == "__main__":
    sweep()
