"""An API worker process of ``mlops-gpu server --workers N`` (N > 1): uvicorn's supervisor
starts N of them on the socket the parent bound; each builds the app (``app``, a factory) on
its own ``Runtime`` from the config file the parent names in ``MLOPS_GPU_SERVER_CONFIG``.

Invariants:
- A worker never schedules: the parent runs the one ``SchedulerThread`` (unless
  ``--no-scheduler``), so a server with N workers is still one candidate for the lease.
- The workers share one rate limit and one identity cache generation (``shared``: memory the
  parent made and names in ``MLOPS_GPU_SERVER_SHARED``).
- A worker tells the scheduler's role (``/readyz``, ``/api/v1/scheduler``) from the store's
  lease: ``leader`` while the lease's holder is its parent process, else ``standby``.
"""

from __future__ import annotations

import os
from typing import Any

ENV_CONFIG = "MLOPS_GPU_SERVER_CONFIG"
ENV_SCHEDULER = "MLOPS_GPU_SERVER_SCHEDULER"


class LeaseRole:
    """The role of the parent's scheduler thread, read from the store's lease on each ask."""

    def __init__(self, store: Any, pid: int) -> None:
        self.store, self.pid = store, pid

    @property
    def role(self) -> str:
        from mlops_gpu.state.lock import current_holder

        holder = current_holder(self.store)
        return "leader" if holder is not None and holder.pid == self.pid else "standby"


def app() -> Any:
    """The app of one worker (uvicorn calls it in the worker process)."""
    from mlops_gpu.config import load_config
    from mlops_gpu.controller import Runtime
    from mlops_gpu.server.app import create_app
    from mlops_gpu.server.shared import ENV, SharedState

    rt = Runtime(load_config(os.environ[ENV_CONFIG]))
    _ = rt.store  # opened before the first request
    from mlops_gpu.server.serve import freeze_heap

    role = LeaseRole(rt.store, os.getppid()) if os.environ.get(ENV_SCHEDULER) == "1" else None
    # the rate limit and the identity cache's generation, one for all the parent's workers
    built = create_app(rt, role, shared=SharedState.attach(os.environ[ENV]))
    freeze_heap()
    return built
