"""``mg.submit_many([...])`` and ``mg.map(fn, iterable, ...)``: many runs in one store
transaction, returning their handles.

- ``submit_many(items)``: each item is a dict of ``mg.submit``'s keywords, with its command or
  callable under ``target``; dependencies (``after``, ``afterok``, ...) and ``begin`` are per
  item; ``hold`` and ``after_name`` apply to the whole batch. All are queued, or none.
- ``map(fn, iterable, limit=N, ...)``: a job array, one element per item, calling ``fn(item)``
  (``Run.result()`` gives its value); at most ``limit`` elements run at once (``%N``). The
  other keywords are ``mg.submit``'s, the same for every element.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from mlops_gpu.controller import SubmitError
from mlops_gpu.controller.jobs import build
from mlops_gpu.model.array_spec import INDEX_ENV
from mlops_gpu.sdk.run import Run, build_spec, job_request, remote_target
from mlops_gpu.state.jobs import JobControl

_JOB_KEYS = ("after", "afterok", "afternotok", "afterany", "begin")


def _local_only(what: str, config: Any) -> None:
    """A server is not asked for one transaction of many runs yet: say so, never open a store
    the client was not meant to open."""
    if remote_target(config) is not None:
        raise SubmitError(f"{what} needs local mode for now (a config, no MLOPS_GPU_URL): "
                          "against a server, queue each run with mg.submit")  # fmt: skip


def _cleanup(commands: Iterable[tuple[str, ...]], targets: Iterable[Any]) -> None:
    for command, target in zip(commands, targets, strict=False):
        if callable(target):  # a submit that fails leaves no pickle behind
            with contextlib.suppress(OSError):
                os.unlink(command[-1])


def submit_many(
    items: Sequence[Mapping[str, Any]],
    *,
    hold: bool = False,
    after_name: str | Sequence[str] | None = None,
    start_scheduler: bool = True,
) -> list[Run]:
    """Queue every item (``mg.submit``'s keywords, the command under ``target``) in one
    transaction; their handles in order. ``ValueError`` names the bad item; none is queued."""
    if not items:
        return []
    _local_only("mg.submit_many", items[0].get("config"))
    rt: Any = None
    specs, commands, targets = [], [], []
    try:
        for i, item in enumerate(items):
            kw = dict(item)
            if "target" not in kw:
                raise ValueError(f"submit_many: item {i} has no 'target' (command or callable)")
            target = kw.pop("target")
            job = {k: kw.pop(k) for k in _JOB_KEYS if k in kw}
            kw.pop("start_scheduler", None)
            targets.append(target)
            rt, spec, command = build_spec(target, **kw)
            commands.append(command)
            built, _ = build(spec, job_request(**job), rt.cfg.max_array_size)
            specs.extend(built)
        names = (after_name,) if isinstance(after_name, str) else tuple(after_name or ())
        runs = rt.submit_many(specs, start_scheduler=start_scheduler,
                              job=JobControl(held=hold, after_names=names))  # fmt: skip
    except BaseException:
        _cleanup(commands, targets)
        raise
    return [Run(r.id, rt) for r in runs]


def map(
    fn: Callable[[Any], Any],
    iterable: Iterable[Any],
    *,
    project: str,
    limit: int | None = None,
    hold: bool = False,
    start_scheduler: bool = True,
    **submit_kw: Any,
) -> list[Run]:
    """One job array: element i runs ``fn(item_i)``; at most ``limit`` at once. Handles in
    order; ``ValueError`` for a bad request, nothing queued."""
    items = list(iterable)
    if not items:
        return []
    if limit is not None and limit < 1:
        raise ValueError(f"map: limit must be a positive integer, got {limit}")
    _local_only("mg.map", submit_kw.get("config"))
    rt: Any = None
    specs, commands = [], []
    try:
        for i, item in enumerate(items):
            rt, spec, command = build_spec(fn, project=project, args=(item,), **submit_kw)
            commands.append(command)
            specs.append(replace(spec, array_index=i, array_limit=limit,
                                 env={**spec.env, INDEX_ENV: str(i)}))  # fmt: skip
        if len(specs) > rt.cfg.max_array_size:
            raise ValueError(f"map: {len(specs)} items, more than max_array_size "
                             f"({rt.cfg.max_array_size})")  # fmt: skip
        runs = rt.submit_many(specs, start_scheduler=start_scheduler,
                              job=JobControl(held=hold, array=True))  # fmt: skip
    except BaseException:
        _cleanup(commands, [fn] * len(commands))
        raise
    return [Run(r.id, rt) for r in runs]
