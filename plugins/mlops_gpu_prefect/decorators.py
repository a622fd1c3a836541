"""Decorators that carry a GPU request into Prefect.

- ``@gpu_flow(work_pool=..., project=..., gpus=...)``: binds a flow to an ``mlops-gpu`` work
  pool, in the manner of prefect-kubernetes' ``@kubernetes``: its ``deploy()`` and
  ``to_deployment()`` default to that pool and those job variables (an explicit argument wins),
  so every run of the deployment queues for its GPUs. ``deploy()`` without an image deploys the
  flow's own file from this host (``flow.from_source`` of its folder), so the worker's host runs
  it where it lies: no image, no remote storage.
- ``@gpu_task(gpus=1, project=...)``: a Prefect task whose body holds GPUs for its duration
  (``mg.gpus``), under the project's quota: inside a flow run of an ``mlops-gpu`` pool they
  are carved from the flow run's own devices first, and queued for otherwise. The body runs in
  a child process whose ``CUDA_VISIBLE_DEVICES`` is exactly its lease's devices (``lease.call``),
  so concurrent ``.submit()`` calls each see their own; ``mg.current_gpus()`` gives them too.
  The lease ends ``succeeded`` when the body returns and ``failed`` when it raises. Arguments and
  the return value travel with cloudpickle; logs of the body are its process's output (not
  Prefect's run logger). ``isolate=False`` runs the body in the task's thread instead: then
  only ``mg.current_gpus()`` names its devices (``CUDA_VISIBLE_DEVICES`` is not touched).
  Synchronous functions.

Invariants: nothing of mlops_gpu's scheduler is imported until a task runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from prefect import Flow, task

F = TypeVar("F", bound=Flow[Any, Any])
JOB_KEYS = ("project", "gpus", "gpu_type", "priority", "max_runtime", "nodes", "backend",
            "experiment", "config", "cpu", "memory")  # fmt: skip


def _from_own_file(fl: Flow[Any, Any]) -> Flow[Any, Any]:
    """The flow loaded from its own file as a deployment's local source."""
    file = Path(inspect.getsourcefile(fl.fn) or fl.fn.__code__.co_filename).resolve()
    made = fl.from_source(source=str(file.parent), entrypoint=f"{file.name}:{fl.fn.__name__}")
    # (Prefect types it for sync and async callers; called from sync code it is the Flow)
    return cast("Flow[Any, Any]", made)


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

            def with_pool(
                *args: Any, _original: Any = original, _method: str = method, **kwargs: Any
            ) -> Any:
                kwargs.setdefault("work_pool_name", work_pool)
                kwargs["job_variables"] = {**bound, **(kwargs.get("job_variables") or {})}
                if _method == "deploy" and kwargs.get("image") is None and fl._storage is None:
                    # Prefect's deploy() needs an image or remote storage: the worker runs on a
                    # host that sees this file, so the deployment pulls it from here
                    return getattr(_from_own_file(fl), _method)(*args, **kwargs)
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
    isolate: bool = True,
    **task_kwargs: Any,
) -> Any:
    def decorate(f: Callable[..., Any]) -> Any:
        @functools.wraps(f)
        def body(*args: Any, **kwargs: Any) -> Any:
            import mlops_gpu as mg

            with mg.gpus(gpus, project=project, gpu_type=gpu_type, priority=priority,
                         name=f"task:{f.__name__}", timeout=timeout, config=config,
                         set_env=False) as lease:  # fmt: skip
                if isolate:
                    return lease.call(f, *args, **kwargs)
                return f(*args, **kwargs)

        return task(body, **task_kwargs)

    return decorate(fn) if fn is not None else decorate
