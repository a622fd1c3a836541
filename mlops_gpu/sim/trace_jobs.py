"""Job control columns of a CSV trace (all optional), so that policies can be compared on
sweeps and pipelines:

- ``id``: the job's id (default ``job-<line - 1>``, six digits), what dependencies name;
- ``array_id`` and ``array_limit``: jobs with the same ``array_id`` form one array, at most
  ``array_limit`` running at once (the same on every element, or empty: no limit). Elements
  must ask for the same GPUs;
- ``dependencies``: ``KIND:ID`` items separated by ``;`` or spaces, KIND one of ``afterok``,
  ``afternotok``, ``afterany`` (or ``after``), ID a job id or an array id (every element).

Invariant: every dependency names a job that arrives no later than the job itself, so the
simulator knows it when the dependent is submitted; anything else is a ``TraceError`` naming
the file, the line and the column.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from mlops_gpu.model import DEPENDENCY_KINDS, Dependency
from mlops_gpu.sim.trace import TraceError, TraceJob


def apply(path: Path, rows: list[tuple[int, dict[str, str], TraceJob]]) -> list[TraceJob]:
    """The jobs of ``rows`` with their ids, arrays and dependencies from the optional columns."""
    jobs: list[tuple[int, dict[str, str], TraceJob]] = []
    seen: dict[str, int] = {}
    for line, row, job in rows:
        jid = (row.get("id") or "").strip() or job.id
        if jid in seen:
            raise TraceError(f"{path}:{line}: column id: {jid!r} is also the id on line "
                             f"{seen[jid]}")  # fmt: skip
        seen[jid] = line
        aid = (row.get("array_id") or "").strip() or None
        limit_raw = (row.get("array_limit") or "").strip()
        limit = None
        if limit_raw:
            if not limit_raw.isdigit() or int(limit_raw) < 1:
                raise TraceError(f"{path}:{line}: column array_limit: expected a positive whole "
                                 f"number, got {limit_raw!r}")  # fmt: skip
            if aid is None:
                raise TraceError(f"{path}:{line}: column array_limit: set without an array_id")
            limit = int(limit_raw)
        jobs.append((line, row, replace(job, id=jid, array_id=aid, array_limit=limit)))
    arrays: dict[str, list[TraceJob]] = defaultdict(list)
    for _, _, job in jobs:
        if job.array_id is not None:
            arrays[job.array_id].append(job)
    for aid, members in arrays.items():
        first = members[0]
        for m in members[1:]:
            if m.array_limit != first.array_limit:
                raise TraceError(f"{path}: array {aid}: array_limit differs between its jobs")
            if (m.gpus, m.nodes, m.accepts, m.project) != (
                first.gpus,
                first.nodes,
                first.accepts,
                first.project,
            ):
                raise TraceError(f"{path}: array {aid}: its jobs must ask for the same GPUs "
                                 "in the same project")  # fmt: skip
        if aid in seen:
            raise TraceError(f"{path}: array {aid}: also a job's id")
    by_id = {job.id: job for _, _, job in jobs}
    out = []
    for line, row, job in jobs:
        deps: list[Dependency] = []
        for item in (row.get("dependencies") or "").replace(";", " ").split():
            kind, _, target = item.partition(":")
            kind = "afterany" if kind == "after" else kind
            if kind not in DEPENDENCY_KINDS or not target:
                raise TraceError(f"{path}:{line}: column dependencies: expected KIND:ID with "
                                 f"KIND afterok, afternotok or afterany, got {item!r}")  # fmt: skip
            targets = [m.id for m in arrays[target]] if target in arrays else [target]
            for t in targets:
                dep = by_id.get(t)
                if dep is None or dep is job or dep.submit_s > job.submit_s:
                    raise TraceError(f"{path}:{line}: column dependencies: {target!r} is not "
                                     "a job or array that arrives before this one")  # fmt: skip
                deps.append(Dependency(kind, t))
        out.append(replace(job, dependencies=tuple(deps)))
    return out
