"""Workload traces for the simulator: the jobs (when, how long, how many GPUs, whose) and the
projects' quota weights.

Invariants:
- ``Trace.jobs`` is sorted by (submit time, id); times are seconds from the trace's start
  (the first job may arrive after 0).
- A job's GPUs are ``gpus`` per node on ``nodes`` nodes; loaders split a request larger than a
  node into equal per-node parts and reject one that does not split evenly.
- Every malformed row raises ``TraceError`` naming the file, the line and the column.

Loaders: ``load_csv`` (the generic format of BENCHMARKS.md), ``load_philly`` (the Philly trace as
flattened by the Pollux artifact, one week by default, virtual clusters as projects) and
``synthetic`` (seeded). Files may be gzip-compressed (``.gz``).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import IO

from mlops_gpu.model import Dependency, Node

#: The project that pools jobs of virtual clusters without a known size.
OTHER = "other"


class TraceError(ValueError):
    """A trace file or argument that cannot be used: the message says where and why."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit_s: float
    duration_s: float
    gpus: int  # per node
    nodes: int
    project: str
    gpu_type: str | None = None
    priority: str = "normal"
    #: A share of one GPU (``gpus`` is then 1), for traces of shared GPUs (openb).
    gpu_fraction: float | None = None
    #: Acceptable GPU types (any of); ``gpu_type``, when set, is the only one.
    gpu_types: tuple[str, ...] = ()
    #: Host CPU (millicores) and memory per node.
    cpu_milli: int = 0
    host_memory_mb: int = 0
    #: Job control (``sim.trace_jobs``): the array it is an element of, and its ``%N``; the
    #: jobs it waits for (by id).
    array_id: str | None = None
    array_limit: int | None = None
    dependencies: tuple[Dependency, ...] = ()

    @property
    def total_gpus(self) -> float:
        """GPUs held: whole GPUs over all nodes, or the share of one GPU."""
        if self.gpu_fraction is not None:
            return self.gpu_fraction
        return float(self.gpus * self.nodes)

    @property
    def accepts(self) -> tuple[str, ...]:
        return (self.gpu_type,) if self.gpu_type else self.gpu_types

    @property
    def gpu_seconds(self) -> float:
        return self.total_gpus * self.duration_s


@dataclass(frozen=True)
class Trace:
    name: str
    jobs: tuple[TraceJob, ...]
    #: project -> weight of its nominal quota (any scale; the simulator scales to the cluster)
    weights: dict[str, float] = field(default_factory=dict)
    #: The trace's own cluster, when it has one (openb); the simulator then ignores
    #: ``--nodes``/``--gpus-per-node``.
    nodes: tuple[Node, ...] = ()

    @property
    def projects(self) -> list[str]:
        return sorted({j.project for j in self.jobs} | set(self.weights))


def _open(path: Path) -> IO[str]:
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def _rows(path: Path, required: set[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each data row; the header must name ``required``."""
    with _open(path) as f:
        reader = csv.DictReader(f)
        missing = required - set(reader.fieldnames or [])
        if missing:
            raise TraceError(
                f"{path}:1: header lacks column(s) {', '.join(sorted(missing))}; "
                f"it has {', '.join(reader.fieldnames or []) or 'nothing'}"
            )
        for row in reader:
            yield reader.line_num, row


def _number(path: Path, line: int, row: dict[str, str], col: str, integer: bool = False) -> float:
    raw = (row.get(col) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {col}: expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{path}:{line}: column {col}: expected a number >= 0, got {raw!r}")
    if integer and value != int(value):
        raise TraceError(f"{path}:{line}: column {col}: expected a whole number, got {raw!r}")
    return value


def _split(path: Path, line: int, total: int, nodes: int | None, per_node: int) -> tuple[int, int]:
    """(GPUs per node, nodes) for ``total`` GPUs."""
    if total < 1:
        raise TraceError(f"{path}:{line}: column gpus: expected at least 1 GPU, got {total}")
    if nodes is None:
        nodes = max(1, math.ceil(total / per_node))
    if nodes < 1 or total % nodes:
        raise TraceError(f"{path}:{line}: {total} GPUs do not split evenly over {nodes} node(s)")
    return total // nodes, nodes


def _timestamp(path: Path, line: int, raw: str, origin: datetime | None) -> float:
    raw = raw.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        raise TraceError(
            f"{path}:{line}: column submit_time: expected seconds or an ISO 8601 time, got {raw!r}"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    base = origin or datetime(1970, 1, 1, tzinfo=UTC)
    return (t - base).total_seconds()


def load_csv(path: str | Path, gpus_per_node: int = 8) -> Trace:
    """The generic format: ``submit_time`` (seconds from the start, or ISO 8601), ``duration_s``,
    ``gpus`` (the job's total), ``project``; optional ``gpu_type``, ``nodes`` (the total splits
    evenly over them; default: as few nodes of ``gpus_per_node`` as hold it), ``priority``,
    and the job control columns of ``sim.trace_jobs`` (``id``, ``array_id``, ``array_limit``,
    ``dependencies``). ISO times are made relative to the earliest one."""
    from mlops_gpu.sim import trace_jobs

    p = Path(path)
    raw: list[tuple[int, dict[str, str], float]] = []
    iso = False
    for line, row in _rows(p, {"submit_time", "duration_s", "gpus", "project"}):
        value = row["submit_time"].strip()
        try:
            t = float(value)
        except ValueError:
            t, iso = _timestamp(p, line, value, None), True
        raw.append((line, row, t))
    origin = min((t for _, _, t in raw), default=0.0) if iso else 0.0
    rows: list[tuple[int, dict[str, str], TraceJob]] = []
    for line, row, t in raw:
        project = (row.get("project") or "").strip()
        if not project:
            raise TraceError(f"{p}:{line}: column project: expected a name, got nothing")
        nodes_raw = (row.get("nodes") or "").strip()
        nodes = int(_number(p, line, row, "nodes", integer=True)) if nodes_raw else None
        total = int(_number(p, line, row, "gpus", integer=True))
        gpus, n = _split(p, line, total, nodes, gpus_per_node)
        rows.append((line, row,
            TraceJob(
                id=f"job-{line - 1:06d}",
                submit_s=t - origin,
                duration_s=_number(p, line, row, "duration_s"),
                gpus=gpus,
                nodes=n,
                project=project,
                gpu_type=(row.get("gpu_type") or "").strip() or None,
                priority=(row.get("priority") or "").strip() or "normal",
            ),
        ))  # fmt: skip
    jobs = trace_jobs.apply(p, rows)
    if not jobs:
        raise TraceError(f"{p}: no jobs in the trace")
    return Trace(p.name, tuple(sorted(jobs, key=lambda j: (j.submit_s, j.id))))


def load_vc_sizes(path: str | Path) -> dict[str, float]:
    """``vc,node num`` rows (the Helios artifact's Philly VC sizes) -> VC -> nodes."""
    p = Path(path)
    out: dict[str, float] = {}
    for line, row in _rows(p, {"vc", "node num"}):
        vc = row["vc"].strip()
        if not vc:
            raise TraceError(f"{p}:{line}: column vc: expected a name, got nothing")
        out[vc] = _number(p, line, row, "node num")
    return out


def load_philly(
    path: str | Path,
    vc_sizes: str | Path,
    start: date = date(2017, 10, 9),
    days: float = 7.0,
    gpus_per_node: int = 8,
) -> Trace:
    """Philly jobs submitted in [start, start + days): the VCs of ``vc_sizes`` become projects
    weighted by their node counts; jobs of other VCs are pooled in project ``other`` (weight 0:
    it only borrows)."""
    p = Path(path)
    if days <= 0:
        raise TraceError(f"--days: expected a number of days > 0, got {days:g}")
    sizes = load_vc_sizes(vc_sizes)
    origin = datetime(start.year, start.month, start.day, tzinfo=UTC)
    end = days * 86400.0
    jobs = []
    for line, row in _rows(p, {"timestamp", "duration", "num_gpus", "cluster"}):
        t = _timestamp(p, line, row["timestamp"], origin)
        if not 0 <= t < end:
            continue
        total = int(_number(p, line, row, "num_gpus", integer=True))
        gpus, n = _split(p, line, total, None, gpus_per_node)
        vc = row["cluster"].strip()
        jobs.append(
            TraceJob(
                id=f"philly-{line - 1:06d}",
                submit_s=t,
                duration_s=_number(p, line, row, "duration"),
                gpus=gpus,
                nodes=n,
                project=vc if vc in sizes else OTHER,
            )
        )
    if not jobs:
        raise TraceError(f"{p}: no jobs submitted in [{start}, +{days:g} days)")
    weights = dict(sizes)
    if any(j.project == OTHER for j in jobs):
        weights[OTHER] = 0.0
    name = f"philly {start} +{days:g}d"
    return Trace(name, tuple(sorted(jobs, key=lambda j: (j.submit_s, j.id))), weights)


def synthetic(
    seed: int = 1,
    jobs: int = 5000,
    projects: int = 4,
    days: float = 2.0,
    gpus_per_node: int = 8,
) -> Trace:
    """A seeded mix: Poisson arrivals over ``days``, durations log-uniform in [5 min, 8 h],
    mostly 1-GPU jobs with some 2/4/8-GPU and 2-node ones; project sizes skewed (the first
    project submits the most, as in real clusters), equal quota weights."""
    if jobs < 1 or projects < 1:
        raise TraceError("synthetic: expected at least one job and one project")
    if days <= 0:
        raise TraceError(f"--days: expected a number of days > 0, got {days:g}")
    rng = random.Random(seed)
    names = [f"team-{i}" for i in range(projects)]
    skew = [1.0 / (i + 1) for i in range(projects)]
    shapes = [(1, 1), (2, 1), (4, 1), (gpus_per_node, 1), (gpus_per_node, 2)]
    shape_w = [0.70, 0.10, 0.08, 0.08, 0.04]
    span = days * 86400.0
    t, out = 0.0, []
    for k in range(jobs):
        t += rng.expovariate(jobs / span)
        gpus, nodes = rng.choices(shapes, shape_w)[0]
        out.append(
            TraceJob(
                id=f"syn-{k:06d}",
                submit_s=t,
                duration_s=math.exp(rng.uniform(math.log(300), math.log(8 * 3600))),
                gpus=gpus,
                nodes=nodes,
                project=rng.choices(names, skew)[0],
            )
        )
    return Trace(f"synthetic seed {seed}", tuple(out), {n: 1.0 for n in names})
