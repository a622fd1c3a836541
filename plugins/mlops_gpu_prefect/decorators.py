"""Decorators that carry a GPU request into Prefect.

- ``@gpu_flow(work_pool=..., project=..., gpus=...)``: binds a flow to an ``mlops-gpu`` work
  pool, in the manner of prefect-kubernetes' ``@kubernetes``: its ``deploy()`` and
  ``to_deployment()`` default to that pool and those job variables (an explicit argument wins),
  so every run of the deployment queues for its GPUs.
- ``@gpu_task(gpus=1, project=...)``: a Prefect task whose body holds GPUs of the local backend
  for its duration (``mg.gpus``): it waits for them under the project's quota, runs with
  ``CUDA_VISIBLE_DEVICES`` set to them, and releases them when it returns or raises; so GPU
  tasks inside one flow share GPUs under the same quotas as every run. Synchronous functions.

Invariants: nothing of mlops_gpu's scheduler is imported until a task runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from prefect import Flow, task

F = TypeVar("F", bound=Flow[Any, Any])
JOB_KEYS = ("project", "gpus", "gpu_type", "priority", "max_runtime", "nodes", "backend",
            "experiment", "config")  # fmt: skip


def gpu_flow(
    *, work_pool: str, project: str, gpus: int = 1, **job_variables: Any
) -> Callable[[F], F]:
    unknown = sorted(set(job_variables) - set(JOB_KEYS))
    if unknown:
        raise TypeError(f"gpu_flow(): unknown job variable(s) {', '.join(unknown)} "
                        f"(known: {', '.join(JOB_KEYS)})")  # fmt: skip
    bound = {"project": project, "gpus": gpus, **job_variables}

    def bind(fl: F) -> F:
        for method in ("deploy", "to_deployment"):
            original = getattr(fl, method)

            def with_pool(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                kwargs.setdefault("work_pool_name", work_pool)
                kwargs["job_variables"] = {**bound, **(kwargs.get("job_variables") or {})}
                return _original(*args, **kwargs)

            functools.update_wrapper(with_pool, original)
            setattr(fl, method, with_pool)
        fl.mlops_gpu_job_variables = dict(bound)  # type: ignore[attr-defined]
        fl.mlops_gpu_work_pool = work_pool  # type: ignore[attr-defined]
        return fl

    return bind


def gpu_task(
    fn: Callable[..., Any] | None = None,
    *,
    project: str,
    gpus: int = 1,
    gpu_type: str | Sequence[str] | None = None,
    priority: str | None = None,
    timeout: float | None = None,
    config: str | None = None,
    **task_kwargs: Any,
) -> Any:
    def decorate(f: Callable[..., Any]) -> Any:
        @functools.wraps(f)
        def body(*args: Any, **kwargs: Any) -> Any:
            import mlops_gpu as mg

            with mg.gpus(gpus, project=project, gpu_type=gpu_type, priority=priority,
                         name=f"task:{f.__name__}", timeout=timeout, config=config):  # fmt: skip
                return f(*args, **kwargs)

        return task(body, **task_kwargs)

    return decorate(fn) if fn is not None else decorate
