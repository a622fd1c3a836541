"""Packing replay of the openb pods onto the openb nodes (BENCHMARKS.md, "Alibaba openb
packing"): pods arrive in file order and never leave; a pod that cannot be placed fails and the
replay goes on, drawing the file again from the top when it runs out, until the GPU demand that
has arrived reaches the cluster's GPU capacity. CPU and memory are modelled with the GPUs, and
the CPU-only pods take part (as CPU-only runs: they hold CPU and memory that GPU pods need).

Placers: ``default`` (the real scheduling core with the shipped policy's placement; preemption
is off since nothing here could gain from it) and the baselines
``fgd`` (FGD as its authors' simulator runs it: ``sim.fgd``), ``first-fit``, ``best-fit``
(least GPU share left on the node after placing, then least CPU; the tightest device for a
share) and ``random`` (seeded). Every placement, the core's included, is booked on one
``Cluster`` model, which also measures the results.

Fragmentation (FGD's measure): for each node and each GPU shape of the file's own mix (weighted
by how often it occurs), the free GPU share that shape could not use there
(``core.fragmentation.shape_fragment``: all of it where the node's GPU model is not one the
shape accepts); the sum over nodes, in GPUs.

The core runs on the native engine (``engines.native.NativeEngine``, Rust) where it is installed
and takes the snapshot (``engine="auto"``), else on the Python reference (``"reference"``,
formerly ``"python"``: a snapshot per cycle, so a whole replay is much slower); ``"native"``
insists on it. Only the engines' public interface is used (``submit``,
``cycle``, ``remove_pending``), and both decide alike (``tests/sim/test_openb.py`` compares
them on a small replay), so the rows are the same on either; ``PackingResult.engine`` says
which ran.

Invariant: no node ever holds more GPU share, CPU or memory than it has (``Cluster.book``
checks every placement, the core's included).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from mlops_gpu.core.fragmentation import Shape, shape_fragment
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.engines import native
from mlops_gpu.model import (
    BackendCapabilities,
    GpuType,
    Node,
    Phase,
    PolicySettings,
    Project,
    Quota,
    Run,
    RunSpec,
)
from mlops_gpu.sim.engines import core_engine
from mlops_gpu.sim.fgd import FgdPlacer
from mlops_gpu.sim.openb import Pod

#: (node index, device indices, share of each device)
Choice = tuple[int, tuple[int, ...], float]
MARKS = (0.8, 0.9, 1.0)
PLACERS = ("default", "fgd", "first-fit", "best-fit", "random")
_EPS = 1e-9


class Cluster:
    """Free GPU share per device, free CPU and memory per node."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.free = [[1.0] * n.capacity for n in self.nodes]
        self.cpu = [n.cpu_milli or 0 for n in self.nodes]
        self.mem = [n.host_memory_mb or 0 for n in self.nodes]
        self.capacity = sum(n.capacity for n in self.nodes)
        self.booked: list[int] = []  # the node of every booking, in order (for placer caches)
        # every booking (pod, node, devices, share) in order: two replays that placed alike
        # have the same ``digest`` (as the rows' ``placements``)
        self._log = hashlib.sha256()

    def fits(self, i: int, pod: Pod) -> bool:
        n = self.nodes[i]
        if pod.gpu_spec and n.gpu_type not in pod.gpu_spec:
            return False
        return pod.cpu_milli <= self.cpu[i] and pod.memory_mib <= self.mem[i]

    def devices(self, i: int, pod: Pod) -> list[int]:
        """Devices of node ``i`` that could take (a whole GPU of, or the share of) ``pod``."""
        if pod.num_gpu == 0:
            return []
        need = pod.share
        return [d for d, f in enumerate(self.free[i]) if f >= need - _EPS]

    def book(self, choice: Choice, pod: Pod) -> None:
        i, devs, share = choice
        assert self.fits(i, pod), f"{pod.name} does not fit node {self.nodes[i].name}"
        assert len(devs) == pod.devices_needed
        for d in devs:
            assert self.free[i][d] >= share - _EPS, f"device {d} of {self.nodes[i].name} is full"
            self.free[i][d] = round(self.free[i][d] - share, 6)
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        self.booked.append(i)
        self._log.update(f"{pod.name} {i} {devs} {share:.6f};".encode())

    def digest(self) -> str:
        """The first 16 hex digits of the bookings' hash, in order."""
        return self._log.hexdigest()[:16]

    def allocated(self) -> float:
        return self.capacity - sum(sum(f) for f in self.free)

    def fragmented(self, mix: Sequence[tuple[Pod, float]]) -> float:
        """FGD's fragmented GPUs for the shapes ``mix`` (pod, weight summing to 1)."""
        total = 0.0
        for i, node in enumerate(self.nodes):
            free = tuple(sorted((f for f in self.free[i] if f > _EPS), reverse=True))
            if not free:
                continue
            sig = (free, self.cpu[i], self.mem[i], node.gpu_type)
            for pod, w in mix:
                shape = (pod.devices_needed, pod.share, pod.cpu_milli, pod.memory_mib, pod.gpu_spec)
                total += w * shape_fragment(sig, shape)
        return total


def file_mix(pods: Sequence[Pod]) -> list[tuple[Pod, float]]:
    """Each distinct GPU shape of ``pods`` (one pod standing for it) with its frequency.
    CPU-only pods are not in it: they cannot use GPU capacity, so counting them would call
    free GPUs fragmented in proportion to how many such pods the file holds."""
    pods = [p for p in pods if p.num_gpu > 0]
    counts: Counter[tuple[int, int, int, int, tuple[str, ...]]] = Counter()
    first: dict[tuple[int, int, int, int, tuple[str, ...]], Pod] = {}
    for p in pods:
        key = (p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, p.gpu_spec)
        counts[key] += 1
        first.setdefault(key, p)
    n = len(pods)
    return [(first[k], c / n) for k, c in sorted(counts.items())]


def file_shapes(pods: Sequence[Pod]) -> dict[Shape, float]:
    """The GPU pods of the file counted by the core's shape (``fragmentation.Shape``, as
    ``capacity.slot_shape`` books them): the workload's distribution, which ``fgd`` is given
    too, for the core's ``Snapshot.shape_prior``."""
    out: Counter[Shape] = Counter()
    for p in pods:
        if p.num_gpu:
            share = round(p.share, 6)
            out[
                (p.devices_needed, share, p.cpu_milli, p.memory_mib, tuple(sorted(p.gpu_spec)))
            ] += 1
    return {s: float(n) for s, n in out.items()}


# -- baselines ------------------------------------------------------------------------------
def _take(c: Cluster, i: int, pod: Pod, devs: list[int], order: Callable[[int], float]) -> Choice:
    if pod.fractional:
        d = min(devs, key=lambda d: (order(d), d))
        return (i, (d,), pod.share)
    return (i, tuple(devs[: pod.devices_needed]), pod.share)


def _candidates(c: Cluster, pod: Pod) -> list[tuple[int, list[int]]]:
    out = []
    need = pod.devices_needed
    for i in range(len(c.nodes)):
        if c.fits(i, pod):
            devs = c.devices(i, pod)
            if len(devs) >= need:
                out.append((i, devs))
    return out


def first_fit(c: Cluster, pod: Pod, rng: random.Random) -> Choice | None:
    for i, devs in _candidates(c, pod):
        return _take(c, i, pod, devs, lambda d: 0.0)
    return None


def best_fit(c: Cluster, pod: Pod, rng: random.Random) -> Choice | None:
    best: tuple[float, int, int] | None = None
    pick: tuple[int, list[int]] | None = None
    for i, devs in _candidates(c, pod):
        gpu_left = sum(c.free[i]) - pod.gpu_demand
        key = (round(gpu_left, 6), c.cpu[i] - pod.cpu_milli, i)
        if best is None or key < best:
            best, pick = key, (i, devs)
    if pick is None:
        return None
    node, devs = pick
    return _take(c, node, pod, devs, c.free[node].__getitem__)  # the tightest device


def random_fit(c: Cluster, pod: Pod, rng: random.Random) -> Choice | None:
    cands = _candidates(c, pod)
    if not cands:
        return None
    i, devs = rng.choice(cands)
    if pod.fractional:
        return (i, (rng.choice(devs),), pod.share)
    return (i, tuple(sorted(rng.sample(devs, pod.devices_needed))), pod.share)


BASELINES = {"first-fit": first_fit, "best-fit": best_fit, "random": random_fit}


# -- the core -------------------------------------------------------------------------------


class CorePlacer:
    """Pods through the real core: one cycle per pod, each pod that the cycle does not admit
    withdrawn (it fails; it does not wait)."""

    PROJECT = "openb"

    def __init__(
        self,
        nodes: Sequence[Node],
        prior: Mapping[Shape, float] | None = None,
        engine: str = "auto",
    ) -> None:
        caps: Counter[str] = Counter()
        for n in nodes:
            caps[n.gpu_type] += n.capacity
        quotas = MappingProxyType({t: Quota(c, 0) for t, c in caps.items()})
        snap = Snapshot(
            now=0.0,
            nodes=tuple(nodes),
            pending=(),
            active=(),
            projects={self.PROJECT: Project(self.PROJECT, quotas=quotas)},
            gpu_types={t: GpuType(t) for t in caps},
            priority_classes={"normal": 100},
            policy=PolicySettings(preemption=False),
            capabilities={n.backend: BackendCapabilities(shared_gpus=True) for n in nodes},
            shape_prior=MappingProxyType(dict(prior or {})),
        )
        self.engine = core_engine(snap, engine, f"openb packing: {native.NOT_INSTALLED}")
        self.engine_name = "native" if isinstance(self.engine, native.NativeEngine) else "reference"
        self.seq = 0

    def __call__(self, c: Cluster, pod: Pod, rng: random.Random) -> Choice | None:
        self.seq += 1
        run_id = f"{pod.name}#{self.seq}"
        spec = RunSpec(pod.name, self.PROJECT, "openb", ("openb",), pod.request())
        self.engine.submit(Run(run_id, self.seq, spec, Phase.PENDING, 1, float(self.seq)))
        d = self.engine.cycle(float(self.seq))
        if not d.admissions:
            self.engine.remove_pending(run_id)
            return None
        (slot,) = d.admissions[0].placement.slots
        node = c.nodes[c.index[slot.node]]
        devs = tuple(node.devices.index(x) for x in slot.devices)
        return (c.index[slot.node], devs, pod.share)


@dataclass
class PackingResult:
    file: str
    policy: str
    allocated_at: dict[float, float]
    unplaced_at: dict[float, float]  # GPUs arrived but not placed by each mark (failed pods)
    failed_pods: int
    failed_cpu_pods: int  # of ``failed_pods``, those that asked for no GPU
    fragmented_gpus: float
    pods_drawn: int
    wall_s: float
    placements: str = ""  # ``Cluster.digest``: equal where every pod was placed alike
    engine: str | None = None  # the core's (``default``): "native" or "reference"

    def row(self) -> dict[str, object]:
        out: dict[str, object] = {"file": self.file, "policy": self.policy}
        for m in MARKS:
            out[f"allocated_at_{round(m * 100)}"] = round(self.allocated_at.get(m, 0.0), 4)
        for m in MARKS:
            out[f"unplaced_gpus_at_{round(m * 100)}"] = round(self.unplaced_at.get(m, 0.0), 3)
        out["unallocated_at_100"] = round(1.0 - self.allocated_at.get(1.0, 0.0), 4)
        out["failed_pods"] = self.failed_pods
        out["failed_cpu_pods"] = self.failed_cpu_pods
        out["fragmented_gpus"] = round(self.fragmented_gpus, 1)
        out["pods_drawn"] = self.pods_drawn
        out["placements"] = self.placements
        out["wall_s"] = round(self.wall_s, 2)
        if self.engine is not None:
            out["engine"] = self.engine
        return out


def replay(
    file: str,
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    policy: str,
    seed: int = 1,
    engine: str = "auto",
) -> PackingResult:
    """Replay ``pods`` (file order) on ``nodes`` under ``policy`` (``PLACERS``); ``default``
    runs the core on ``engine`` (``engines.ENGINES``)."""
    if policy not in PLACERS:
        raise ValueError(f"unknown placer {policy!r}; expected one of {', '.join(PLACERS)}")
    if not any(p.num_gpu for p in pods):
        raise ValueError(f"{file}: no GPU pods to replay")
    t0 = time.perf_counter()
    c = Cluster(nodes)
    place: Callable[[Cluster, Pod, random.Random], Choice | None]
    used: str | None = None
    if policy == "default":
        core = CorePlacer(nodes, file_shapes(pods), engine)  # the workload's shapes, as fgd's
        place, used = core, core.engine_name
    elif policy == "fgd":
        place = FgdPlacer(pods)  # its typical shapes: the file's pods, once
    else:
        place = BASELINES[policy]
    rng = random.Random(seed)
    arrived, failed, failed_cpu, drawn = 0.0, 0, 0, 0
    marks = list(MARKS)
    at: dict[float, float] = {}
    short: dict[float, float] = {}
    while marks:
        pod = pods[drawn % len(pods)]
        drawn += 1
        arrived += pod.gpu_demand
        choice = place(c, pod, rng)
        if choice is None:
            failed += 1
            failed_cpu += pod.num_gpu == 0
        else:
            c.book(choice, pod)
        while marks and arrived >= marks[0] * c.capacity - _EPS:
            short[marks[0]] = max(0.0, arrived - c.allocated())
            at[marks.pop(0)] = c.allocated() / c.capacity
    frag = c.fragmented(file_mix(pods))
    wall = time.perf_counter() - t0
    return PackingResult(
        file, policy, at, short, failed, failed_cpu, frag, drawn, wall, c.digest(), used
    )
