"""FGD, the packing baseline: Fragmentation Gradient Descent (Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX
ATC'23), as its authors' simulator runs it (``hkust-adsl/kubernetes-scheduler-simulator``:
``pkg/simulator/plugin/fgd_score.go``, ``pkg/utils/frag.go``, ``GetTypicalPods`` there, and the
experiment settings of ``scripts/generate_config_and_run.py``). Kept apart from our own
placement (``core.fragmentation``) so that neither can drift toward the other.

What it follows, point by point:
- Typical pods (``typical_pods``): the workload's pods, CPU-only pods included, grouped by shape
  (CPU millicores, GPU milli per GPU, GPU count, accepted GPU models as written); shapes taken
  in decreasing count (ties: the larger shape first) until they cover 95% of the pods, their
  counts then normalised to sum to 1 (``podPopularityThreshold`` 95, ``podIncreaseStep`` 1,
  ``gpuResWeight`` 0, ``isInvolvedCpuPods`` true, as in the paper's runs). Host memory is not
  part of a shape.
- A node's fragmentation for one shape (``shape_frag``, in milli-GPUs), from its free milli per
  GPU, free CPU and GPU model: 0 without free GPU; all free GPU for a CPU-only shape (FGD's
  "XL"/"XR" classes count as fragment), for a shape the node's model does not serve, for a shape
  that lacks CPU or enough GPUs with its milli left; otherwise (the shape fits) the milli on
  GPUs with less left than the shape's milli. A node's fragmentation (``node_frag``) is the
  sum over typical shapes, weighted by popularity, added in the typical order.
- The score of a node for a pod (``node_score``): ``int(100 * sigmoid((before - after) /
  1000))``, the Kubernetes framework's integer node score, where ``after`` is the node once the
  pod's CPU and GPU are taken (memory is not in the score: FGD's node model has none). A
  fractional pod tries every GPU with enough milli left, in device order, and keeps the first
  with the best score: that GPU is also the one it gets. A whole-GPU pod takes the fully free
  GPUs of lowest index. A CPU-only pod takes CPU only.
- The node (``FgdPlacer``): every node that passes the filters (GPU model, a GPU with enough
  milli or enough fully free GPUs, CPU and memory: the Kubernetes filters with the
  Open-Gpu-Share plugin) is scored; the highest score wins, ties to the lexicographically
  smallest node name (the simulator's ``selectHost``).

Invariants: the score of a node depends only on its state (free milli per GPU as a multiset,
free CPU, model) and the pod's shape, so it is memoised by state; a placement is always one
``packing.Cluster.fits`` and ``Cluster.devices`` allow.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mlops_gpu.sim.openb import Pod

if TYPE_CHECKING:
    from mlops_gpu.sim.packing import Choice, Cluster

MILLI = 1000
POPULARITY_THRESHOLD = 95  # percent of the pods the typical shapes must cover
INCREASE_STEP = 1
MAX_SCORE = 100

#: (CPU millicores, GPU milli per GPU (0: no GPU), GPUs, accepted models "A|B" or "" for any)
Shape = tuple[int, int, int, str]
#: (shape, popularity), popularities summing to 1
Typical = tuple[tuple[Shape, float], ...]
#: (free milli per GPU, largest first, zeros left out; free CPU millicores; GPU model)
State = tuple[tuple[int, ...], int, str]


def pod_shape(pod: Pod) -> Shape:
    milli = 0 if pod.num_gpu == 0 else pod.gpu_milli
    return (pod.cpu_milli, milli, pod.num_gpu, "|".join(pod.gpu_spec))


def typical_pods(
    pods: Sequence[Pod], threshold: int = POPULARITY_THRESHOLD, step: int = INCREASE_STEP
) -> Typical:
    """The workload's typical shapes and their popularity (``GetTypicalPods``)."""
    counts: Counter[Shape] = Counter(pod_shape(p) for p in pods)
    total = float(sum(counts.values()))
    if total == 0:
        return ()
    # decreasing count; equal counts: the larger shape (cpu, milli, gpus, model) first
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    expected = threshold * total / 100.0
    taken, cum, upto = 0, 0.0, 0
    while cum < expected:
        upto += step
        while taken < upto and taken < len(ordered):
            cum += ordered[taken][1]
            taken += 1
    if taken >= len(ordered):
        return tuple((s, n / total) for s, n in ordered)
    return tuple((s, (n / total) / (cum / total)) for s, n in ordered[:taken])


def accessible(node_model: str, accepts: str) -> bool:
    """Whether a node of ``node_model`` serves a shape accepting ``accepts`` ("A|B"; "": any)."""
    wanted = [m for m in accepts.split("|") if m]
    return not wanted or node_model in wanted


def shape_frag(state: State, shape: Shape) -> int:
    """The free milli-GPUs of a node in ``state`` that FGD counts as fragment for ``shape``."""
    free, cpu, model = state
    total = sum(free)
    if total == 0:
        return 0
    need_cpu, milli, gpus, accepts = shape
    if milli == 0 or not accessible(model, accepts):
        return total  # CPU-only shapes (satisfied or not) and models it does not serve
    if sum(1 for x in free if x >= milli) >= gpus and cpu >= need_cpu:
        return sum(x for x in free if x < milli)
    return total  # lacks GPU, CPU or both


def node_frag(state: State, typical: Typical) -> float:
    """The node's expected fragmentation (milli-GPUs) under the typical shapes."""
    out = 0.0
    for shape, p in typical:
        out += p * float(shape_frag(state, shape))
    return out


def sigmoid_score(before: float, after: float) -> int:
    """The framework's integer node score for a change of fragmentation from ``before`` to
    ``after`` (milli-GPUs): 50 for none, higher the more it falls."""
    return int(1.0 / (1.0 + math.exp(-((before - after) / MILLI))) * MAX_SCORE)


def state_of(free: Sequence[int], cpu: int, model: str) -> State:
    return (tuple(sorted((x for x in free if x > 0), reverse=True)), cpu, model)


def node_score(
    free: Sequence[int], cpu: int, model: str, shape: Shape, frag: Callable[[State], float]
) -> tuple[int, tuple[int, ...]]:
    """(score, devices the pod gets) for a pod of ``shape`` on a node with ``free`` milli per
    device (device order), ``cpu`` free and GPU ``model``, given the node fragmentation
    ``frag`` (``node_frag`` under the typical shapes); the pod must fit."""
    need_cpu, milli, gpus, _ = shape
    before = frag(state_of(free, cpu, model))
    if gpus == 1 and 0 < milli < MILLI:
        best, dev = -1, -1
        for d, left in enumerate(free):
            if left < milli:
                continue
            after = list(free)
            after[d] -= milli
            s = sigmoid_score(before, frag(state_of(after, cpu - need_cpu, model)))
            if s > best:  # the first device with the best score, as the plugin keeps it
                best, dev = s, d
        return best, (dev,)
    devs = tuple(d for d, left in enumerate(free) if left == MILLI)[:gpus] if milli else ()
    after = [0 if d in devs else x for d, x in enumerate(free)]
    return sigmoid_score(before, frag(state_of(after, cpu - need_cpu, model))), devs


#: a node as the placer groups them: (free milli per device in device order, free CPU, free
#: memory, GPU model); nodes alike score alike, and the tie goes to the smallest name
NodeKey = tuple[tuple[int, ...], int, int, str]


class FgdPlacer:
    """FGD over ``packing.Cluster``. Nodes in the same state are grouped (kept up to date from
    ``Cluster.booked``), so each state is scored once per pod and the group's smallest node
    name stands for it; node fragmentation and scores are memoised by state."""

    def __init__(self, pods: Sequence[Pod]) -> None:
        self.typical = typical_pods(pods)
        self._frag: dict[State, float] = {}
        self._scores: dict[tuple[NodeKey, Shape], tuple[int, tuple[int, ...]]] = {}
        self._groups: dict[NodeKey, set[int]] = {}  # key -> ranks (name order) of its nodes
        self._key: list[NodeKey] = []  # per node index
        self._rank: list[int] = []  # per node index
        self._index: list[int] = []  # per rank
        self._cursor = -1  # how much of ``Cluster.booked`` is applied; -1: not built

    def frag(self, state: State) -> float:
        got = self._frag.get(state)
        if got is None:
            got = self._frag[state] = node_frag(state, self.typical)
        return got

    def _sync(self, c: Cluster) -> None:
        if self._cursor < 0:
            self._index = sorted(range(len(c.nodes)), key=lambda i: c.nodes[i].name)
            self._rank = [0] * len(c.nodes)
            for r, i in enumerate(self._index):
                self._rank[i] = r
            self._key = [self._node_key(c, i) for i in range(len(c.nodes))]
            for i, k in enumerate(self._key):
                self._groups.setdefault(k, set()).add(self._rank[i])
            self._cursor = len(c.booked)
        for i in c.booked[self._cursor :]:
            old, new = self._key[i], self._node_key(c, i)
            group = self._groups[old]
            group.discard(self._rank[i])
            if not group:
                del self._groups[old]
            self._groups.setdefault(new, set()).add(self._rank[i])
            self._key[i] = new
        self._cursor = len(c.booked)
        if len(self._scores) > 1_000_000:  # bound the memo; it refills from the live states
            self._scores.clear()

    @staticmethod
    def _node_key(c: Cluster, i: int) -> NodeKey:
        free = tuple(round(f * MILLI) for f in c.free[i])
        return (free, c.cpu[i], c.mem[i], c.nodes[i].gpu_type)

    def __call__(self, c: Cluster, pod: Pod, rng: random.Random) -> Choice | None:
        self._sync(c)
        shape = pod_shape(pod)
        need_cpu, milli, gpus, _ = shape
        best: tuple[int, int, tuple[int, ...]] | None = None  # (-score, rank, devices)
        for key, ranks in self._groups.items():
            free, cpu, mem, model = key
            # the filters: GPU model, CPU, memory, enough GPUs with the milli left
            if pod.gpu_spec and model not in pod.gpu_spec:
                continue
            if cpu < need_cpu or mem < pod.memory_mib:
                continue
            if gpus and sum(1 for x in free if x >= milli) < gpus:
                continue
            got = self._scores.get((key, shape))
            if got is None:
                got = node_score(free, cpu, model, shape, self.frag)
                self._scores[(key, shape)] = got
            cand = (-got[0], min(ranks), got[1])
            if best is None or cand[:2] < best[:2]:
                best = cand
        if best is None:
            return None
        return (self._index[best[1]], best[2], pod.share)
