"""MLflow file and database stores (the default ``sqlite:///.../mlflow.db``) for the scheduler's
tracker, through the ``mlflow`` package: the same calls as ``telemetry.mlflow_rest.MlflowRest``.

Only the scheduler process uses this (one import of mlflow, on the first tracked run); jobs
never do. Invariant: every failure is a ``TrackingError``, as with the REST client.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from mlops_gpu.telemetry.mlflow_rest import TrackingError

T = TypeVar("T")


class MlflowLocal:
    def __init__(self, uri: str) -> None:
        self.base = uri
        self._client: Any = None
        self._lock = threading.Lock()

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        with self._lock:  # one writer: a file store is no place for racing threads
            try:
                if self._client is None:
                    from mlflow.tracking import MlflowClient

                    self._client = MlflowClient(self.base)
                return fn(self._client)
            except Exception as e:  # mlflow raises MlflowException, SQLAlchemy and OS errors
                raise TrackingError(f"{what} on {self.base}: {e}") from None

    def experiment_id(self, name: str) -> str:
        def get(c: Any) -> str:
            exp = c.get_experiment_by_name(name)
            return str(exp.experiment_id if exp is not None else c.create_experiment(name))

        return self._call("experiment", get)

    def create_run(
        self, experiment_id: str, name: str, tags: Mapping[str, str] | None = None
    ) -> str:
        return self._call(
            "create run",
            lambda c: str(c.create_run(experiment_id, tags=dict(tags or {}), run_name=name)
                          .info.run_id),
        )  # fmt: skip

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._batch("set tags", run_id, (), tags)

    def log_batch(
        self,
        run_id: str,
        metrics: Sequence[tuple[str, float, float, int]],
        tags: Mapping[str, str],
    ) -> None:
        self._batch("log batch", run_id, metrics, tags)

    def _batch(
        self,
        what: str,
        run_id: str,
        metrics: Sequence[tuple[str, float, float, int]],
        tags: Mapping[str, str],
    ) -> None:
        def log(c: Any) -> None:
            from mlflow.entities import Metric, RunTag

            rows = [Metric(k, float(v), int(t * 1000), s) for k, v, t, s in metrics]
            c.log_batch(run_id, metrics=rows, tags=[RunTag(k, v) for k, v in tags.items()])

        self._call(what, log)

    def find_run(self, experiment_id: str, tags: Mapping[str, str]) -> str | None:
        flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())

        def find(c: Any) -> str | None:
            found = c.search_runs([experiment_id], filter_string=flt, max_results=1)
            return str(found[0].info.run_id) if found else None

        return self._call("search runs", find)

    def finish(self, run_id: str, status: str = "FINISHED", end: float | None = None) -> None:
        when = None if end is None else int(end * 1000)
        self._call("end run", lambda c: c.set_terminated(run_id, status, when))
