"""MLflow file and database stores (the default ``sqlite:///.../mlflow.db``) for the scheduler's
tracker, through the ``mlflow`` package: the same calls as ``tracking.rest.MlflowRest``.

Only the scheduler process uses this (one import of mlflow, on the first tracked run); jobs
never do.

Invariants:
- Every failure is a ``TrackingError``, as with the REST client; ``TrackingUnavailable`` when
  the store itself cannot be used (it cannot be opened, a database error), a plain
  ``TrackingError`` when MLflow answered about one run or experiment (not found, invalid value).
- A SQLite store that cannot be opened fails at once, naming the file: it is checked before
  MLflow opens it, since MLflow retries opening a SQLite file for about 100 s.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mlops_gpu.tracking.rest import TrackingError, TrackingUnavailable

T = TypeVar("T")

#: MLflow error codes about one run or experiment: the store works, this call's object does not.
ONE_OBJECT = {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS",
              "INVALID_STATE", "BAD_REQUEST"}  # fmt: skip
SQLITE_HEADER = b"SQLite format 3\x00"


def check_sqlite(uri: str) -> None:
    """Raise ``TrackingUnavailable`` naming the file if a ``sqlite:///`` store cannot be opened
    (a folder or another kind of file at its path, a folder that cannot be created)."""
    if not uri.startswith("sqlite:///") or ":memory:" in uri:
        return
    path = Path(uri[len("sqlite:///") :].split("?", 1)[0])
    fix = "move it away or set mlflow.tracking_uri in the config"
    if path.is_dir():
        raise TrackingUnavailable(f"MLflow store {path} is a folder, not a SQLite file: {fix}")
    if path.exists():
        try:
            with open(path, "rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except OSError as e:
            raise TrackingUnavailable(f"MLflow store {path} cannot be read ({e}): {fix}") from None
        if head and head != SQLITE_HEADER:
            raise TrackingUnavailable(f"MLflow store {path} is not a SQLite database: {fix}")
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise TrackingUnavailable(
            f"MLflow store {path} cannot be created ({parent} is not a writable folder): {fix}"
        )


class MlflowLocal:
    def __init__(self, uri: str) -> None:
        self.base = uri
        self._client: Any = None
        self._lock = threading.Lock()

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        with self._lock:  # one writer: a file store is no place for racing threads
            try:
                if self._client is None:
                    check_sqlite(self.base)
                    from mlflow.tracking import MlflowClient

                    client = MlflowClient(self.base)
                    client.get_experiment("0")  # opens the store (MLflow opens it lazily)
                    self._client = client
                return fn(self._client)
            except TrackingError:
                raise
            except Exception as e:  # mlflow raises MlflowException, SQLAlchemy and OS errors
                code = str(getattr(e, "error_code", ""))
                kind = TrackingError if code in ONE_OBJECT else TrackingUnavailable
                raise kind(f"{what} on {self.base}: {e}") from None

    @property
    def opened(self) -> bool:
        return self._client is not None

    def open(self) -> None:
        """Open the store now (imports mlflow, creates or upgrades the store's tables)."""
        self._call("open", lambda c: None)

    def experiment_id(self, name: str, artifact_location: str | None = None) -> str:
        def get(c: Any) -> str:
            exp = c.get_experiment_by_name(name)
            if exp is not None:
                return str(exp.experiment_id)
            return str(c.create_experiment(name, artifact_location=artifact_location))

        return self._call("experiment", get)

    def create_run(
        self,
        experiment_id: str,
        name: str,
        tags: Mapping[str, str] | None = None,
        start: float | None = None,
    ) -> str:
        when = None if start is None else int(start * 1000)
        return self._call(
            "create run",
            lambda c: str(c.create_run(experiment_id, start_time=when, tags=dict(tags or {}),
                                       run_name=name).info.run_id),
        )  # fmt: skip

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._batch("set tags", run_id, (), tags)

    def log_batch(
        self,
        run_id: str,
        metrics: Sequence[tuple[str, float, float, int]],
        tags: Mapping[str, str],
        params: Mapping[str, str] | None = None,
    ) -> None:
        self._batch("log batch", run_id, metrics, tags, params)

    def _batch(
        self,
        what: str,
        run_id: str,
        metrics: Sequence[tuple[str, float, float, int]],
        tags: Mapping[str, str],
        params: Mapping[str, str] | None = None,
    ) -> None:
        def log(c: Any) -> None:
            from mlflow.entities import Metric, Param, RunTag

            rows = [Metric(k, float(v), int(t * 1000), s) for k, v, t, s in metrics]
            c.log_batch(run_id, metrics=rows, tags=[RunTag(k, v) for k, v in tags.items()],
                        params=[Param(k, v) for k, v in (params or {}).items()])  # fmt: skip

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
