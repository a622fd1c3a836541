"""Expected GPU fragmentation of a node for a mix of run shapes (FGD: Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", ATC'23).

A node's state, for this purpose, is its ``Sig``: the free share of each device that still has
some (whole free devices count 1.0), largest first, its free host CPU and memory (None: not
tracked) and its GPU type. For one shape, the fragment is the free GPU share the shape could
not use:
- all of it, when the shape does not fit at all (a GPU type it does not accept, too little CPU
  or memory, too few whole GPUs, no device with enough share left);
- for a whole-GPU shape that fits, the share left on partly used devices;
- for a fractional shape that fits, the share on devices with less left than the shape needs.
A node's expected fragmentation is the mix-weighted sum over shapes. Placing a run where that
sum grows least keeps free capacity in pieces the cluster's runs can use.

Invariants:
- ``Mix`` holds the shapes of the runs holding GPUs (one entry per gang member), counted exactly
  (``add``/``remove`` are inverses), so the mix depends only on which runs are active, never on
  the order they came in: the Rust engine (its state kept between cycles) and the reference
  (a state per cycle) see the same mix.
- The weights come from the active runs' counts plus the fixed ``prior`` counts (the
  workload's expected shapes, ``Snapshot.shape_prior``; empty by default; any finite
  counts, whole or not, each shape's accepted types in any order: a prior shape is keyed as
  ``slot_shape`` keys an active one, its types sorted): the commonest
  shapes (ties by shape), at most ``TOP_K``, until they cover ``COVERAGE`` of the runs, as
  FGD's typical pods do (rare shapes, whose holes would seldom be filled, left out), each
  share rounded to 1/``QUANTUM``: small changes in the counts leave the weights unchanged.
  Every sum of counts runs in the ranked
  order (count descending, then shape), so it never depends on the order shapes came in,
  even where counts are not whole. ``restricted`` counts active runs only.
- A shape carries the GPU types its run accepted (empty: any), as its placer books it.
  ``restricted`` is worked out from the exact counts (not the rounded weights).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

#: (GPUs per node, share of each GPU: 1.0 for whole GPUs, host CPU millicores, host memory MB,
#: accepted GPU types or () for any)
Shape = tuple[int, float, int, int, tuple[str, ...]]
#: (free share per device, largest first; free host CPU; free host memory; GPU type)
Sig = tuple[tuple[float, ...], int | None, int | None, str]

#: At most this many shapes weighed. 128, not 64: on openb's gpuspec33 file (432 distinct
#: shapes, the accepted GPU models being part of a shape) 64 cut the mix before its 95% cover
#: and left out every multi-GPU shape, so whole nodes only 8-GPU runs can use were broken up
#: (benchmarks/RESULTS.md); the default file's 126 shapes never reach either bound.
TOP_K = 128
COVERAGE = 0.95
QUANTUM = 1000
_EPS = 1e-9


def shape_fragment(sig: Sig, shape: Shape) -> float:
    """The free GPU share of a node in state ``sig`` that a run of ``shape`` could not use."""
    free, cpu, mem, gpu_type = sig
    total = sum(free)
    if total <= _EPS:
        return 0.0
    gpus, share, need_cpu, need_mem, accepts = shape
    if accepts and gpu_type not in accepts:
        return total
    if (cpu is not None and need_cpu > cpu) or (mem is not None and need_mem > mem):
        return total
    if share >= 1.0 - _EPS:
        whole = sum(1 for x in free if x >= 1.0 - _EPS)
        return total if whole < gpus else total - whole
    usable = sum(x for x in free if x >= share - _EPS)
    return total - usable


class Mix:
    def __init__(self, prior: Mapping[Shape, float] | None = None) -> None:
        self.counts: Counter[Shape] = Counter()
        #: The prior by canonical shape (accepted types sorted, as ``slot_shape`` makes
        #: them): shapes equal but for that order are one, their counts summed in the prior's
        #: order (``native/src/fragmentation.rs``'s ``add_prior`` does the same).
        self.prior: dict[Shape, float] = {}
        for (gpus, share, cpu, mem, accepts), n in (prior or {}).items():
            if not math.isfinite(n) or n < 0:
                raise ValueError(
                    f"shape_prior: the count of shape {(gpus, share, cpu, mem, accepts)!r} "
                    f"must be a finite number not below 0, got {n!r}"
                )
            key = (gpus, share, cpu, mem, tuple(sorted(accepts)))
            self.prior[key] = self.prior[key] + n if key in self.prior else n

    def add(self, shape: Shape) -> None:
        self.counts[shape] += 1

    def remove(self, shape: Shape) -> None:
        self.counts[shape] -= 1
        if self.counts[shape] <= 0:
            del self.counts[shape]

    def restricted(self) -> dict[str, float]:
        """GPUs held per type by runs that accept only some types: a run accepting k types
        counts 1/k of its GPU share on each (rounded to 1e-6, so the same counts always give
        the same figures)."""
        out: dict[str, float] = {}
        for (gpus, share, _, _, accepts), n in sorted(self.counts.items()):
            if not accepts:
                continue
            distinct = set(accepts)
            for t in distinct:
                out[t] = out.get(t, 0.0) + n * gpus * share / len(distinct)
        return {t: round(v, 6) for t, v in out.items()}

    def weights(self) -> tuple[tuple[Shape, float], ...]:
        counts: dict[Shape, float] = dict(self.prior)
        for s, k in self.counts.items():
            counts[s] = counts.get(s, 0.0) + k
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        # (summed in the ranked order, not the dict's, which follows the order shapes came
        # in: a prior's counts need not be whole, and then the order changes the sum)
        need, cum = COVERAGE * sum(n for _, n in ranked), 0.0
        top: list[tuple[Shape, float]] = []
        for s, n in ranked[:TOP_K]:
            if cum >= need:
                break
            top.append((s, n))
            cum += n
        total = sum(n for _, n in top)
        rounded = ((s, round(n / total * QUANTUM) / QUANTUM) for s, n in top)
        return tuple((s, p) for s, p in rounded if p > 0)

    def cpu_per_gpu(self) -> float | None:
        """The mix's host CPU per GPU (millicores), or None without CPU requests."""
        w = self.weights()
        gpus = sum(p * s[0] * s[1] for s, p in w)  # GPUs x share
        cpu = sum(p * s[2] for s, p in w)
        return cpu / gpus if gpus > 0 and cpu > 0 else None

    def imbalance(self, sig: Sig) -> float:
        """How far a node in state ``sig`` is from the CPU per free GPU the mix needs, as a
        fraction of it, in steps of 1/4 (0 with no free GPU, untracked CPU or no CPU mix): a
        node far below strands GPUs for want of CPU, one far above strands CPU."""
        free = sum(sig[0])
        ratio = self.cpu_per_gpu()
        if sig[1] is None or ratio is None or free <= _EPS:
            return 0.0
        return round(abs(sig[1] / free - ratio) / ratio * 4) / 4

    def node_fragment(self, sig: Sig) -> float:
        """Expected fragment of a node in state ``sig`` under the current weights."""
        return sum(p * shape_fragment(sig, s) for s, p in self.weights())


def after_whole(sig: Sig, gpus: int, cpu: int, mem: int) -> Sig:
    """``sig`` once a run takes ``gpus`` whole devices and the host resources."""
    free = list(sig[0])
    for _ in range(gpus):
        free.remove(1.0)
    return (tuple(free), _less(sig[1], cpu), _less(sig[2], mem), sig[3])


def after_share(sig: Sig, left_before: float, share: float, cpu: int, mem: int) -> Sig:
    """``sig`` once a run takes ``share`` of a device that had ``left_before`` free."""
    free = list(sig[0])
    free.remove(left_before)
    left = round(left_before - share, 6)
    if left > _EPS:
        free.append(left)
    return (tuple(sorted(free, reverse=True)), _less(sig[1], cpu), _less(sig[2], mem), sig[3])


def after_host(sig: Sig, cpu: int, mem: int) -> Sig:
    """``sig`` once a run takes host resources only (a CPU-only run)."""
    return (sig[0], _less(sig[1], cpu), _less(sig[2], mem), sig[3])


def _less(have: int | None, take: int) -> int | None:
    return None if have is None else have - take
