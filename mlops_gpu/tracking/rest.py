"""A small MLflow REST client (stdlib only): what a job-side launcher needs, without importing the
``mlflow`` package (seconds of import, in every one of dozens of jobs starting together).

Endpoints (MLflow REST API 2.0): ``experiments/get-by-name``, ``experiments/create``,
``runs/create``, ``runs/search``, ``runs/log-batch`` (at most 1,000 metrics per call, so
batches are split), ``runs/update``. Authentication: ``MLFLOW_TRACKING_TOKEN`` (bearer) or
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (basic), as the mlflow client reads them.

Invariants: every failure is a ``TrackingError`` naming the endpoint and the server's answer;
``TrackingUnavailable`` (a subclass) when the server could not be reached, did not answer in
time or failed itself (5xx, 429): MLflow is away, not just this call's run. No retries here:
the caller decides (the scheduler's tracker backs off; MLflow's own client would retry for
minutes).
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

BATCH = 1000


class TrackingError(RuntimeError):
    """The MLflow server refused or could not be reached."""


class TrackingUnavailable(TrackingError):
    """MLflow could not be reached or did not answer: every run's tracking would fail now."""


def rest_uri(uri: str | None) -> str | None:
    """The tracking URI if it is a server (http/https), else None (file and database stores
    need the mlflow package)."""
    if uri and urllib.parse.urlparse(uri).scheme in ("http", "https"):
        return uri.rstrip("/")
    return None


class MlflowRest:
    def __init__(self, base: str, timeout_s: float = 5.0) -> None:
        self.base = base.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        url = f"{self.base}/api/2.0/mlflow/{path}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        token = os.environ.get("MLFLOW_TRACKING_TOKEN")
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        elif user:
            pair = f"{user}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}".encode()
            req.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            kind = TrackingUnavailable if e.code >= 500 or e.code == 429 else TrackingError
            raise kind(f"{method} {path}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise TrackingUnavailable(f"{method} {path}: {self.base} unreachable: {e}") from None
        return json.loads(raw) if raw else {}

    def experiment_id(self, name: str, artifact_location: str | None = None) -> str:
        """The id of experiment ``name``, created if missing (with ``artifact_location``, when
        given: else the server's default artifact root)."""
        q = urllib.parse.urlencode({"experiment_name": name})
        try:
            return str(
                self._call("GET", f"experiments/get-by-name?{q}")["experiment"]["experiment_id"]
            )
        except TrackingError as e:
            if "RESOURCE_DOES_NOT_EXIST" not in str(e):
                raise
        body = {"name": name}
        if artifact_location:
            body["artifact_location"] = artifact_location
        return str(self._call("POST", "experiments/create", body)["experiment_id"])

    def create_run(
        self,
        experiment_id: str,
        name: str,
        tags: Mapping[str, str] | None = None,
        start: float | None = None,
    ) -> str:
        """A new run (started at ``start``, seconds, default now); its id."""
        body = {
            "experiment_id": experiment_id,
            "run_name": name,
            "start_time": int((time.time() if start is None else start) * 1000),
            "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
        }
        return str(self._call("POST", "runs/create", body)["run"]["info"]["run_id"])

    def log_metrics(self, run_id: str, metrics: Sequence[tuple[str, float, float, int]]) -> None:
        """``metrics``: (key, value, time s, step), sent in batches of ``BATCH``."""
        for i in range(0, len(metrics), BATCH):
            self.log_batch(run_id, metrics[i : i + BATCH], {})

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self.log_batch(run_id, (), tags)

    def log_batch(
        self,
        run_id: str,
        metrics: Sequence[tuple[str, float, float, int]],
        tags: Mapping[str, str],
        params: Mapping[str, str] | None = None,
    ) -> None:
        """Metrics (at most ``BATCH``), tags and params in one call (a list left out when
        empty)."""
        body: dict[str, Any] = {"run_id": run_id}
        if params:
            body["params"] = [{"key": k, "value": v} for k, v in params.items()]
        if metrics:
            body["metrics"] = [
                {"key": k, "value": v, "timestamp": int(t * 1000), "step": s}
                for k, v, t, s in metrics
            ]
        if tags:
            body["tags"] = [{"key": k, "value": v} for k, v in tags.items()]
        self._call("POST", "runs/log-batch", body)

    def find_run(self, experiment_id: str, tags: Mapping[str, str]) -> str | None:
        """The id of a run of the experiment carrying all ``tags``, or None."""
        flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        body = {"experiment_ids": [experiment_id], "filter": flt, "max_results": 1}
        found = self._call("POST", "runs/search", body).get("runs", [])
        return str(found[0]["info"]["run_id"]) if found else None

    def finish(self, run_id: str, status: str = "FINISHED", end: float | None = None) -> None:
        when = time.time() if end is None else end
        body = {"run_id": run_id, "status": status, "end_time": int(when * 1000)}
        self._call("POST", "runs/update", body)
