"""``mg.sweep``: a hyperparameter search on Optuna in which every trial is a scheduled run.

The study asks for a trial, the trial's parameters go to ``objective(params)`` inside a run of
``gpus_per_trial`` GPUs (queued under the project's quota like any run), and its value is told
back when the run ends. All trial runs nest under one MLflow parent run (``mlflow.parentRunId``),
and each logs its parameters and metrics there.

Parallelism follows the queue: a new trial is submitted whenever every trial in flight is
admitted (none waits in the queue), up to ``max_parallel``. So the sweep grows while its project
can get GPUs, its own or idle ones borrowed from its cohort, and stops growing as soon as a
trial has to wait. Trials are preemptible: when a lender wants its GPUs back, the scheduler
reclaims the borrowing trials (checkpoint signal, then requeue as a new attempt, which runs
``objective`` again), and the sweep does not submit more while they wait.

Invariants: exactly ``trials`` trials are told (a failed run is told FAIL, not retried by the
sweep); the driving loop runs in a thread of the caller (``Sweep.wait`` joins it); nothing but
the trial itself runs inside a job.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlops_gpu.sdk.run import Run, RunFailed, _runtime, remote_target, submit, tracking_uri
from mlops_gpu.tracking.tracker import PARENT_ENV


def distributions(space: Mapping[str, Any]) -> dict[str, Any]:
    """Optuna distributions from a compact space: ``(low, high)`` (floats: uniform, ints:
    integers), ``("log", low, high)``, a list of choices, or an Optuna distribution."""
    from optuna.distributions import (
        BaseDistribution,
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, Any] = {}
    for name, spec in space.items():
        if isinstance(spec, BaseDistribution):
            out[name] = spec
        elif isinstance(spec, list):
            out[name] = CategoricalDistribution(spec)
        elif isinstance(spec, tuple) and len(spec) == 3 and spec[0] == "log":
            out[name] = FloatDistribution(float(spec[1]), float(spec[2]), log=True)
        elif isinstance(spec, tuple) and len(spec) == 2:
            lo, hi = spec
            if isinstance(lo, int) and isinstance(hi, int):
                out[name] = IntDistribution(lo, hi)
            else:
                out[name] = FloatDistribution(float(lo), float(hi))
        else:
            raise ValueError(
                f"space[{name!r}]: expected (low, high), ('log', low, high), a list of choices "
                f"or an optuna distribution, got {spec!r}"
            )
    return out


def run_trial(objective: Callable[[dict[str, Any]], Any], params: dict[str, Any],
              metric: str) -> dict[str, float]:  # fmt: skip
    """Inside the trial's job: the objective, then its parameters and metrics in MLflow."""
    value = objective(params)
    metrics = (
        {k: float(v) for k, v in value.items()} if isinstance(value, Mapping)
        else {metric: float(value)}
    )  # fmt: skip
    if metric not in metrics:
        raise ValueError(f"the objective returned no {metric!r}: {sorted(metrics)}")
    if os.environ.get("MLFLOW_RUN_ID"):
        import mlflow

        with mlflow.start_run():  # the attempt's run (MLFLOW_RUN_ID)
            mlflow.log_params(params)
            mlflow.log_metrics(metrics)
    return metrics


@dataclass
class Trial:
    number: int
    params: dict[str, Any]
    run: Run
    value: float | None = None
    state: str = "running"  # running, complete, failed


@dataclass
class Sweep:
    """A running sweep: ``wait()``, ``best_params``, ``best_value``, ``trials``, ``study``."""

    name: str
    study: Any
    metric: str
    trials: list[Trial] = field(default_factory=list)
    parent_run_id: str | None = None
    error: BaseException | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float | None = None) -> Sweep:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"sweep {self.name} still runs after {timeout}s")
        if self.error is not None:
            raise self.error
        return self

    def cancel(self) -> None:
        """Stop asking for trials and cancel those in flight."""
        self._stop.set()
        for t in self.trials:
            if t.state == "running":
                t.run.cancel()

    @property
    def best_value(self) -> float:
        return float(self.study.best_value)

    @property
    def best_params(self) -> dict[str, Any]:
        return dict(self.study.best_params)


def sweep(
    objective: Callable[[dict[str, Any]], Any],
    space: Mapping[str, Any],
    *,
    trials: int,
    project: str,
    gpus_per_trial: int = 1,
    max_parallel: int | None = None,
    direction: str = "minimize",
    metric: str = "loss",
    gpu_type: str | Sequence[str] | None = None,
    priority: str | None = None,
    name: str | None = None,
    experiment: str | None = None,
    seed: int | None = None,
    config: str | os.PathLike[str] | None = None,
    poll_s: float = 0.5,
) -> Sweep:
    """Start a sweep of ``trials`` trials; returns at once (``.wait()`` for the end)."""
    import optuna

    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"direction must be 'minimize' or 'maximize', not {direction!r}")
    dists = distributions(space)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction=direction, sampler=sampler)  # type: ignore[arg-type]
    name = name or f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    sw = Sweep(name, study, metric)
    sw.parent_run_id = _parent_run(name, project, experiment, config, dict(space), trials)
    cap = max_parallel or trials
    asked: dict[int, Any] = {}

    def submit_one() -> None:
        ot = study.ask(dists)
        env = {PARENT_ENV: sw.parent_run_id} if sw.parent_run_id else {}
        run = submit(run_trial, args=(objective, dict(ot.params), metric), project=project,
                     gpus=gpus_per_trial, gpu_type=gpu_type, priority=priority,
                     name=f"{name}#{ot.number}", experiment=experiment or project, env=env,
                     config=config)  # fmt: skip
        asked[ot.number] = ot
        sw.trials.append(Trial(ot.number, dict(ot.params), run))

    def drive() -> None:
        try:
            while not sw._stop.is_set():
                flying = [t for t in sw.trials if t.state == "running"]
                for t in flying:
                    status = t.run.status
                    if status in ("succeeded", "failed", "cancelled"):
                        _tell(study, asked[t.number], t, metric)
                flying = [t for t in sw.trials if t.state == "running"]
                queued = any(t.run.status == "pending" for t in flying)
                if len(sw.trials) < trials and len(flying) < cap and not queued:
                    submit_one()
                    continue  # look again at once: the queue may take another
                if len(sw.trials) == trials and not flying:
                    break
                time.sleep(poll_s)
        except BaseException as e:  # surfaced by wait()
            sw.error = e
        finally:
            _close_parent(sw, config)

    sw._thread = threading.Thread(target=drive, name=f"mlops-gpu {name}", daemon=True)
    sw._thread.start()
    return sw


def _tell(study: Any, ot: Any, t: Trial, metric: str) -> None:
    import optuna

    try:
        metrics = t.run.result()
        t.value, t.state = float(metrics[metric]), "complete"
        study.tell(ot, t.value)
    except (RunFailed, KeyError, TypeError, ValueError):
        t.state = "failed"
        study.tell(ot, state=optuna.trial.TrialState.FAIL)


def _client(config: str | os.PathLike[str] | None) -> Any:
    from mlflow.tracking import MlflowClient

    if remote_target(config) is None:
        return MlflowClient(_runtime(config).cfg.tracking_uri(dict(os.environ)))
    uri = tracking_uri(config)  # the server's
    if uri is None:
        raise RuntimeError("the server tracks nothing (mlflow.enabled: false)")
    return MlflowClient(uri)


def _parent_run(name: str, project: str, experiment: str | None,
                config: str | os.PathLike[str] | None, space: dict[str, Any],
                trials: int) -> str | None:  # fmt: skip
    """The sweep's MLflow parent run (None when MLflow cannot be reached: trials still run)."""
    try:
        client = _client(config)
        exp_name = experiment or project
        exp = client.get_experiment_by_name(exp_name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(exp_name)
        run = client.create_run(
            exp_id, run_name=name, tags={"mlops_gpu.sweep": name, "mlops_gpu.project": project}
        )
        client.log_param(run.info.run_id, "trials", trials)
        client.log_param(run.info.run_id, "space", repr(space)[:500])
        return str(run.info.run_id)
    except Exception:  # tracking is never a reason not to sweep
        return None


def _close_parent(sw: Sweep, config: str | os.PathLike[str] | None) -> None:
    if sw.parent_run_id is None:
        return
    try:
        client = _client(config)
        done = [t for t in sw.trials if t.state == "complete"]
        if done:
            client.log_metric(sw.parent_run_id, f"best_{sw.metric}", sw.best_value)
            for k, v in sw.best_params.items():
                client.log_param(sw.parent_run_id, f"best_{k}", v)
        client.log_metric(sw.parent_run_id, "trials_complete", len(done))
        ok = sw.error is None
        client.set_terminated(sw.parent_run_id, "FINISHED" if ok else "FAILED")
    except Exception:
        return
