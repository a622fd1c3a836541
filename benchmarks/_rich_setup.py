"""``core_throughput.py --setup rich``: the default set-up's 1,000 nodes x 8 GPUs (3 types) and
50,000 runs, with the parts of the policy the default set-up leaves idle in use. Seeded and
deterministic (its own ``random.Random(seed)``), so its ``decisions_sha256`` is stable.

- A quarter of the nodes (every fourth of each type) are partitioned: on a100-80gb and
  h100-80gb alternately MIG nodes (4 whole GPUs, 2 GPUs as 14 ``1g.10gb`` slices and 2 as 4
  ``3g.40gb`` slices) and shared nodes (time-sliced, 8 GPUs with a memory cap of the type's
  memory); every fourth l40s-48gb node is shared. 100 MIG nodes and 150 shared nodes in all.
- Every node has a ``rack`` label (16 nodes a rack, in name order) and host CPU (128 cores)
  and memory (1 TiB). 2-node gangs ask for ``rack``: half of them required, half preferred.
- Runs: 80% whole GPUs (the default set-up's shapes), 10% parts of shared GPUs (a quarter or
  half of one, or 20 GB of its memory), 10% MIG slices (one or two ``1g.10gb``, or one
  ``3g.40gb``, on a100-80gb or h100-80gb). Every run asks for host CPU and memory per node,
  in proportion to its GPUs, up to a whole node's.
- Projects ``p00`` to ``p04`` have budgets of 4,000 GPU-hours per 24 h: ``p00``-``p02`` wait
  when it is spent, ``p03`` and ``p04`` are lowered to class ``low``. What they spent is
  ``Spending``: the GPU-hours of their runs that ended within the window (a run's GPU-hours
  count when it ends), handed to every cycle.

It runs ``placement: best-fit`` (its digests in ``benchmarks/RESULTS.md`` were taken so);
``core_throughput.py --placement fragmentation`` runs it under the shipped default, which
weighs its MIG, shared and host-tracking nodes alike on both engines.
"""

from __future__ import annotations

import math
import random
from collections import deque
from types import MappingProxyType

from mlops_gpu.core import PolicySettings, Snapshot
from mlops_gpu.model import (
    BackendCapabilities,
    Budget,
    Cohort,
    GpuType,
    Node,
    Phase,
    Project,
    Quota,
    ResourceRequest,
    Run,
    RunSpec,
)
from mlops_gpu.model.cluster import mig_share

MEMORY_MB = {"a100-80gb": 81920, "h100-80gb": 81920, "l40s-48gb": 49152}
MIG_TYPES = ("a100-80gb", "h100-80gb")
MIG_LAYOUT = {"1g.10gb": 14, "3g.40gb": 4}  # slices of 2 GPUs each
NODE_CPU_MILLI, NODE_MEMORY_MB = 128_000, 1_048_576
RACK = 16
BUDGETED, BUDGET_GPU_HOURS, WINDOW_S = 5, 4000.0, 86400.0


def nodes(n_nodes: int, types: dict[str, float]) -> list[Node]:
    out, i = [], 0
    for t, share in types.items():
        for k in range(round(n_nodes * share)):
            name = f"node-{i:04d}"
            common = {
                "labels": MappingProxyType({"rack": f"rack-{i // RACK:03d}"}),
                "cpu_milli": NODE_CPU_MILLI,
                "host_memory_mb": NODE_MEMORY_MB,
            }
            special = k % 4 == 3
            mig = special and t in MIG_TYPES and (k // 4) % 2 == 0
            if mig:
                slices = {
                    p: tuple(f"{name}-mig-{p}-{s}" for s in range(count))
                    for p, count in MIG_LAYOUT.items()
                }
                out.append(Node(name, "sim", t, ("0", "1", "2", "3"), mig=slices, **common))  # type: ignore[arg-type]
            else:
                out.append(
                    Node(
                        name,
                        "sim",
                        t,
                        tuple(str(d) for d in range(8)),
                        shared=special,
                        gpu_memory_mb=MEMORY_MB[t],
                        **common,  # type: ignore[arg-type]
                    )
                )
            i += 1
    return out


def template(n_nodes: int, types: dict[str, float], order: str) -> Snapshot:
    all_nodes = nodes(n_nodes, types)
    cap: dict[str, float] = dict.fromkeys(types, 0.0)
    for n in all_nodes:
        cap[n.gpu_type] += n.capacity + sum(len(s) * mig_share(p) for p, s in n.mig.items())
    projects = {}
    for p in range(20):
        name = f"p{p:02d}"
        budget = None
        if p < BUDGETED:
            lower = p >= 3
            budget = Budget(
                WINDOW_S,
                gpu_hours=BUDGET_GPU_HOURS,
                action="lower" if lower else "wait",
                lower_to="low" if lower else None,
            )
        quotas = {t: Quota(int(c) // 20, None) for t, c in cap.items()}
        projects[name] = Project(
            name, cohort=f"c{p % 4}", quotas=MappingProxyType(quotas), budget=budget
        )
    return Snapshot(
        now=0.0,
        nodes=tuple(all_nodes),
        pending=(),
        active=(),
        projects=projects,
        gpu_types={t: GpuType(t, 2.0) for t in types},
        priority_classes={"normal": 100, "low": 50},
        cohorts={f"c{c}": Cohort(f"c{c}") for c in range(4)},
        policy=PolicySettings(order=order, placement="best-fit"),
        capabilities={"sim": BackendCapabilities(multi_node=True, mig=True, shared_gpus=True)},
    )


def request(
    rng: random.Random,
    types: dict[str, float],
    shapes: list[tuple[tuple[int, int], float]],
) -> ResourceRequest:
    kind = rng.random()
    if kind < 0.1:  # part of a shared GPU
        gpu_type = rng.choices(list(types), list(types.values()))[0]
        frac, mem = rng.choice([(0.25, None), (0.5, None), (None, 20480)])
        return ResourceRequest(
            1, 1, (gpu_type,), gpu_fraction=frac, gpu_memory_mb=mem,
            cpu_milli=4000, host_memory_mb=32768,
        )  # fmt: skip
    if kind < 0.2:  # MIG slices
        profile, count = rng.choice([("1g.10gb", 1), ("1g.10gb", 2), ("3g.40gb", 1)])
        return ResourceRequest(
            count, 1, (rng.choice(MIG_TYPES),), mig=profile,
            cpu_milli=2000 * count, host_memory_mb=16384 * count,
        )  # fmt: skip
    shape, weights = zip(*shapes, strict=True)
    gpus, width = rng.choices(shape, weights)[0]
    gpu_type = rng.choices(list(types), list(types.values()))[0]
    topo = width > 1
    return ResourceRequest(
        gpus,
        width,
        (gpu_type,),
        topology_key="rack" if topo else None,
        topology_required=topo and rng.random() < 0.5,
        cpu_milli=gpus * rng.choice([4000, 8000, 12000, 16000]),
        host_memory_mb=gpus * rng.choice([32768, 65536, 131072]),
    )


def workload(
    n_nodes: int,
    n_runs: int,
    seed: int,
    order: str,
    types: dict[str, float],
    shapes: list[tuple[tuple[int, int], float]],
) -> tuple[Snapshot, list[Run], dict[str, float]]:
    rng = random.Random(seed)
    snap = template(n_nodes, types, order)
    runs, durations = [], {}
    for k in range(n_runs):
        req = request(rng, types, shapes)
        duration = math.exp(rng.uniform(math.log(600), math.log(36000)))
        rid = f"r{k:05d}"
        spec = RunSpec(
            name=rid,
            project=f"p{rng.randrange(20):02d}",
            user="bench",
            command=("true",),
            request=req,
            priority="normal",
            max_runtime_s=2 * duration,
        )
        runs.append(Run(rid, k, spec, Phase.PENDING, 1, 0.0))
        durations[rid] = duration
    return snap, runs, durations


class Spending:
    """What the budgeted projects spent in the rolling window: the GPU-hours of their runs
    that ended within ``WINDOW_S`` of now (a run's GPU-hours count when it ends)."""

    def __init__(self, snap: Snapshot) -> None:
        self.budgeted = {p for p, proj in snap.projects.items() if proj.budget is not None}
        self.ended: deque[tuple[float, str, float]] = deque()
        self.hours = dict.fromkeys(sorted(self.budgeted), 0.0)

    def ended_run(self, run: Run, now: float, duration: float) -> None:
        if run.project not in self.budgeted or run.placement is None:
            return
        gpu_h = run.placement.gpu_amount * duration / 3600
        self.ended.append((now, run.project, gpu_h))
        self.hours[run.project] += gpu_h

    def spent(self, now: float) -> dict[str, tuple[float, float]]:
        while self.ended and self.ended[0][0] <= now - WINDOW_S:
            _, project, gpu_h = self.ended.popleft()
            self.hours[project] -= gpu_h
        return {p: (h, 0.0) for p, h in self.hours.items()}
