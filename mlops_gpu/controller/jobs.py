"""Job control requests as every edge takes them (CLI, SDK, API): arrays, dependencies, holds
and begin times, turned into the specs and ``state.jobs.JobControl`` of one submit.

Formats (one-line ``ValueError`` for anything else):
- ``array``: Slurm's syntax (``model.array_spec``): ``0-99``, ``1,3,5``, ``0-99:2``, ``%N``;
  at most ``max_array_size`` (config) elements. Each element gets ``MLOPS_GPU_ARRAY_INDEX``.
- dependencies: run ids or array ids, comma separated (``--afterok ID[,ID]``); ``after`` is
  ``afterany``: start after they end, however they end.
- ``begin``: ``now``, ``now+DURATION`` (``now+90s``, ``now+10m``, ``now+2h``, ``now+1d``) or an
  ISO 8601 time (``2026-12-02T15:00``; without an offset it is the local time, as Slurm's), or
  seconds since the epoch (the API).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from mlops_gpu.model import Dependency, Run, RunSpec
from mlops_gpu.model.array_spec import INDEX_ENV, parse_array
from mlops_gpu.state.jobs import JobControl

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True, slots=True)
class JobRequest:
    array: str | None = None
    after: tuple[str, ...] = ()
    afterok: tuple[str, ...] = ()
    afternotok: tuple[str, ...] = ()
    afterany: tuple[str, ...] = ()
    after_names: tuple[str, ...] = ()
    hold: bool = False
    begin: str | float | None = None

    @property
    def empty(self) -> bool:
        return self == JobRequest()


def _ids(values: Iterable[str], flag: str) -> list[str]:
    out = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                raise ValueError(f"{flag}: expected run ids separated by commas, got {v!r}")
            out.append(part)
    return out


def parse_begin(value: str | float, now: float) -> float:
    """Seconds since the epoch for a ``--begin`` value (see the module docstring)."""
    if isinstance(value, int | float):
        if not math.isfinite(value):  # NaN would be ignored, infinity never start
            raise ValueError(f"--begin: expected a finite time, got {value!r}")
        return float(value)
    text = value.strip()
    if text == "now":
        return now
    if text.startswith("now+"):
        amount = text[4:].strip()
        unit = amount[-1:] if amount[-1:] in _UNITS else "s"
        number = amount[:-1] if amount[-1:] in _UNITS else amount
        try:
            seconds = float(number) * _UNITS[unit]
        except ValueError:
            seconds = -1.0
        if seconds < 0 or not math.isfinite(seconds) or seconds > 100 * 365 * 86400:
            raise ValueError(f"--begin: expected now+DURATION such as now+2h, got {value!r}")
        return now + seconds
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--begin: expected now, now+DURATION (now+2h) or an ISO time "
            f"(2026-12-02T15:00), got {value!r}"
        ) from None
    return when.timestamp()  # (naive: local time)


def build(
    spec: RunSpec, req: JobRequest, max_array_size: int, now: float | None = None
) -> tuple[list[RunSpec], JobControl]:
    """The specs of one submit of ``spec`` with ``req``, and its ``JobControl``."""
    now = time.time() if now is None else now
    deps = [Dependency("afterany", i) for i in _ids(req.after, "--after")]
    for kind in ("afterok", "afternotok", "afterany"):
        deps += [Dependency(kind, i) for i in _ids(getattr(req, kind), f"--{kind}")]
    begin_at = parse_begin(req.begin, now) if req.begin is not None else None
    for name in req.after_names:
        if not name.strip():
            raise ValueError("--after-name: expected a run name, got an empty one")
    base = replace(spec, dependencies=tuple(deps), begin_at=begin_at)
    job = JobControl(held=req.hold, array=req.array is not None, after_names=req.after_names)
    if req.array is None:
        return [base], job
    arr = parse_array(req.array, max_array_size)
    return [
        replace(base, array_index=i, array_limit=arr.limit, env={**base.env, INDEX_ENV: str(i)})
        for i in arr.indices
    ], job


def submit_job(
    rt: Any, spec: RunSpec, req: JobRequest, *, start_scheduler: bool = False
) -> list[Run]:
    """Validate and queue ``spec`` with ``req`` (``Runtime.submit_many``); SubmitError on bad
    input, nothing queued."""
    from mlops_gpu.controller.runtime import SubmitError

    try:
        specs, job = build(spec, req, rt.cfg.max_array_size)
    except ValueError as e:
        raise SubmitError(str(e)) from None
    runs: list[Run] = rt.submit_many(specs, start_scheduler=start_scheduler, job=job)
    return runs


def request_of(body: dict[str, Any]) -> JobRequest:
    """The job control fields of an API submit body (the CLI's names, lists for the ids)."""

    def many(key: str) -> tuple[str, ...]:
        v = body.get(key) or ()
        return (v,) if isinstance(v, str) else tuple(str(x) for x in v)

    return JobRequest(
        array=body.get("array"),
        after=many("after"),
        afterok=many("afterok"),
        afternotok=many("afternotok"),
        afterany=many("afterany"),
        after_names=many("after_name"),
        hold=bool(body.get("hold", False)),
        begin=body.get("begin"),
    )


def ids_text(runs: Sequence[Run]) -> str:
    """What a submit prints: the run id, or an array's id."""
    if len(runs) > 1 and runs[0].spec.array_id is not None:
        return runs[0].spec.array_id
    return runs[0].id if len(runs) == 1 else "\n".join(r.id for r in runs)
