"""Everything MLflow: the clients, the tracker that makes and closes each attempt's MLflow run,
and the queue that closes them off the tick's path. (Named ``tracking``, not ``mlflow``, so that
``import mlflow`` inside it always means the MLflow distribution.)

Two halves, two layers (the import contract in ``pyproject.toml`` holds them apart):
- the clients, beside ``telemetry`` and importing nothing of ours but ``model``: ``rest`` (MLflow's
  REST API, stdlib only: the job's launcher uses it), ``local`` (the ``mlflow`` package, for the
  local SQLite store), ``thread`` (the one thread every MLflow call runs on), ``fields`` (what an
  attempt's MLflow run shows);
- the service, above ``state`` and below ``controller``: ``tracker`` (``Tracker``) and
  ``close_queue`` (``TrackingQueue``).

The store's own record of MLflow runs (the table ``mlflow_runs``, written and read by
``state.mlflow_notes``) stays in ``state``: it is SQL over the store's tables, which the store
and a schema migration run, and the store imports nothing above it.

This module imports nothing: importing one client never loads the others (``import mlops_gpu``
stays light; the launcher loads only ``rest``).
"""
