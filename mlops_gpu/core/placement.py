"""Where a run fits now: best-fit bin-packing over the nodes a backend offers.

Rules (in order):
- only schedulable nodes of the GPU type, of a backend whose capabilities allow the shape;
- whole GPUs: a node with at least ``gpus`` fully free devices, choosing the node left with the
  fewest free devices afterwards (best fit keeps large blocks whole for large runs), then name;
- gangs: ``nodes`` distinct nodes of one backend, all or nothing, each chosen best-fit; with a
  topology key, all members share the label's value (required), or such a group is tried first
  (preferred);
- shared: one device with enough fraction and memory left, the fullest such device first;
- MIG: ``gpus`` free slices of the profile on one node, best fit;
- CPU-only (``gpus`` 0): one node with the host resources free, the node left with the most
  CPU per free GPU share first (it strands the fewest GPUs; one with no free GPU, none), then
  name;
- every node taken must have the request's host CPU and memory free where it tracks them;
- under ``placement: fragmentation``, on a cluster where that can matter (shared devices, or
  nodes tracking host resources), a one-node whole or shared request goes to the node (and
  device) whose expected fragmentation (``fragmentation``) grows least, compared in FGD's
  integer score classes (``growth_class``), then CPU balance, then node name: on the openb
  trace coarse classes in a fixed order pack better than exact growth with best fit (FGD
  itself: 0.9431 against 0.9243 of GPUs at 100% arrived demand; benchmarks/RESULTS.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.fragmentation import Sig, after_host, after_share, after_whole
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import BackendCapabilities, Node, NodeSlot, Placement, ResourceRequest, Run
from mlops_gpu.model.cluster import mig_share

NodeFilter = Callable[[Node, int], bool]


def eligible_nodes(snap: Snapshot, cap: Capacity, run: Run, gpu_type: str) -> list[Node]:
    """Schedulable nodes of ``gpu_type`` whose backend can host the run's shape."""
    req, pinned = run.request, run.spec.backend
    shape = req.shape
    out = []
    for node in cap.of_type.get(gpu_type, ()):
        if not node.schedulable:
            continue
        if pinned is not None and node.backend != pinned:
            continue
        caps = snap.caps(node.backend)
        if req.nodes > 1 and not caps.multi_node:
            continue
        if shape == "mig" and (not caps.mig or req.mig not in node.mig):
            continue
        if shape == "shared" and (not caps.shared_gpus or not node.shared):
            continue
        if not cap.host_fits(node.name, req):
            continue
        out.append(node)
    return out


def place(
    snap: Snapshot, cap: Capacity, run: Run, gpu_type: str, fits: NodeFilter | None = None
) -> Placement | None:
    """The best placement of ``run`` on GPUs of ``gpu_type`` free in ``cap``, or None.

    ``fits(node, free_after)`` may veto a node (backfill uses it to protect a reservation).
    """
    req = run.request
    fgd = snap.policy.placement == "fragmentation" and cap.fragmentable
    nodes = eligible_nodes(snap, cap, run, gpu_type)
    if req.shape == "mig":
        return _place_mig(cap, nodes, req, gpu_type, fits)
    if req.shape == "shared":
        return _place_shared(cap, nodes, req, gpu_type, fits, fgd)
    if req.shape == "cpu":
        return _place_cpu(cap, nodes, req, gpu_type, fits, fgd)
    if fgd and req.nodes == 1 and req.topology_key is None:
        return _place_whole_fgd(cap, nodes, req, gpu_type, fits)
    return _place_whole(cap, nodes, req, gpu_type, fits)


def growth_class(growth: float) -> int:
    """The class of a growth of expected fragmentation (GPUs), lower better: minus the
    Kubernetes node score FGD gives it, ``int(100 * sigmoid(-growth))`` (steps of about 0.04
    GPU near no growth, wider further off)."""
    return -int(100.0 / (1.0 + math.exp(growth)))


def fragment_growth(cap: Capacity, placement: Placement) -> tuple[float, float, str]:
    """How good ``placement`` (not yet taken) is for fragmentation, lower is better: (class of
    the growth of its nodes' expected fragmentation, CPU/GPU imbalance left, its first node's
    name). The same order the one-type placers use, so that types compare as nodes do."""
    total, imbalance, left = 0.0, 0.0, 0.0
    for slot in placement.slots:
        sig = cap.signature(slot.node)
        if not slot.devices:
            after = after_host(sig, slot.cpu_milli, slot.host_memory_mb)
        elif slot.fraction >= 1.0 and slot.memory_mb is None:
            after = after_whole(sig, len(slot.devices), slot.cpu_milli, slot.host_memory_mb)
        else:
            used = cap.shared.get(slot.node, {}).get(slot.devices[0], (0.0, 0))[0]
            had = round(1.0 - used, 6)
            after = after_share(sig, had, slot.fraction, slot.cpu_milli, slot.host_memory_mb)
        growth = cap.mix.node_fragment(after) - cap.mix.node_fragment(sig)
        off = cap.mix.imbalance(after)
        total, imbalance, left = total + growth, imbalance + off, left + sum(after[0])
    return (growth_class(round(total, 9)), imbalance, placement.slots[0].node)


def _place_cpu(
    cap: Capacity,
    nodes: list[Node],
    req: ResourceRequest,
    gpu_type: str,
    fits: NodeFilter | None,
    fgd: bool,
) -> Placement | None:
    best: tuple[float, float, float, str] | None = None
    for n in nodes:
        if fits is not None and not fits(n, len(cap.free[n.name])):
            continue
        sig = cap.signature(n.name)
        score = (0.0, 0.0)
        if fgd:
            score = _score(cap, sig, after_host(sig, req.cpu_milli, req.host_memory_mb))
        # Then the node left with the most CPU per free GPU: a CPU-only run there strands
        # the fewest GPUs (a node without free GPUs strands none).
        cpu, share = cap.cpu_free[n.name], sum(sig[0])
        left = math.inf if cpu is None else cpu - req.cpu_milli
        per_gpu = math.inf if share <= 1e-9 else left / share
        key = (*score, -per_gpu, n.name)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    node = cap.nodes[best[3]]
    return Placement(node.backend, gpu_type, (_slot(req, node.name, ()),))


def _score(cap: Capacity, sig: Sig, after: Sig) -> tuple[float, float]:
    """(class of the growth of expected fragmentation, CPU/GPU imbalance left): lower is
    better."""
    growth = cap.mix.node_fragment(after) - cap.mix.node_fragment(sig)
    return (growth_class(round(growth, 9)), cap.mix.imbalance(after))


def _slot(req: ResourceRequest, node: str, devices: tuple[str, ...], frac: float = 1.0) -> NodeSlot:
    mem = req.gpu_memory_mb if req.shape == "shared" else None
    return NodeSlot(node, devices, frac, mem, req.cpu_milli, req.host_memory_mb)


def _place_whole_fgd(
    cap: Capacity, nodes: list[Node], req: ResourceRequest, gpu_type: str, fits: NodeFilter | None
) -> Placement | None:
    """One node, whole GPUs: least class of growth of expected fragmentation, then CPU balance,
    then name."""
    best: tuple[float, float, str] | None = None
    for n in nodes:
        left = len(cap.free[n.name]) - req.gpus
        if left < 0 or (fits is not None and not fits(n, left)):
            continue
        sig = cap.signature(n.name)
        after = after_whole(sig, req.gpus, req.cpu_milli, req.host_memory_mb)
        key = (*_score(cap, sig, after), n.name)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    node = cap.nodes[best[2]]
    devs = tuple(cap.free[node.name][: req.gpus])
    return Placement(node.backend, gpu_type, (_slot(req, node.name, devs),))


def _best(cands: Iterable[tuple[Node, int]]) -> list[tuple[Node, int]]:
    # Least free left after placing, then node name: deterministic best fit.
    return sorted(cands, key=lambda c: (c[1], c[0].name))


def _place_whole(
    cap: Capacity, nodes: list[Node], req: ResourceRequest, gpu_type: str, fits: NodeFilter | None
) -> Placement | None:
    cands = []
    for n in nodes:
        left = len(cap.free[n.name]) - req.gpus
        if left >= 0 and (fits is None or fits(n, left)):
            cands.append((n, left))
    if not cands:
        return None
    by_backend: dict[str, list[tuple[Node, int]]] = defaultdict(list)
    for c in _best(cands):
        by_backend[c[0].backend].append(c)
    choice: list[Node] | None = None
    for backend in sorted(by_backend):
        group = _gang(by_backend[backend], req)
        if group is not None and (choice is None or _cost(cap, group) < _cost(cap, choice)):
            choice = group
    if choice is None:
        return None
    slots = tuple(_slot(req, n.name, tuple(cap.free[n.name][: req.gpus])) for n in choice)
    return Placement(backend=choice[0].backend, gpu_type=gpu_type, slots=slots)


def free_counts(
    snap: Snapshot, cap: Capacity, gpu_type: str, pinned: str | None, nodes: int, gpus: int
) -> dict[str, int]:
    """Per backend that may host a whole-GPU request on ``nodes`` nodes of ``gpu_type`` (the
    pinned one only; multi-node capable for gangs), by name: how many of its schedulable nodes
    have ``gpus`` whole devices free now (host resources not checked)."""
    out: dict[str, int] = {}
    for n in cap.of_type.get(gpu_type, ()):
        if not n.schedulable or (pinned is not None and n.backend != pinned):
            continue
        if nodes > 1 and not snap.caps(n.backend).multi_node:
            continue
        out[n.backend] = out.get(n.backend, 0) + (len(cap.free[n.name]) >= gpus)
    return dict(sorted(out.items()))


def _cost(cap: Capacity, group: list[Node]) -> tuple[int, tuple[str, ...]]:
    return (sum(len(cap.free[n.name]) for n in group), tuple(n.name for n in group))


def _gang(cands: list[tuple[Node, int]], req: ResourceRequest) -> list[Node] | None:
    """``req.nodes`` nodes out of best-fit-ordered candidates, honouring topology."""
    if len(cands) < req.nodes:
        return None
    key = req.topology_key
    if key is None or (req.nodes == 1 and not req.topology_required):
        return [n for n, _ in cands[: req.nodes]]
    groups: dict[str, list[Node]] = defaultdict(list)
    for n, _ in cands:
        if key in n.labels:
            groups[n.labels[key]].append(n)
    whole = [g[: req.nodes] for _, g in sorted(groups.items()) if len(g) >= req.nodes]
    if whole:
        # the group whose chosen members leave the least free (best fit), then label value
        return min(whole, key=lambda g: sum(left for n, left in cands if n in g))
    if req.topology_required:
        return None
    return [n for n, _ in cands[: req.nodes]]


def request_amount(run: Run) -> float:
    """GPUs the run will be charged before it is placed: whole GPUs, its fraction, its MIG
    slices' share (a memory-only shared request is charged its memory's share once placed,
    and counts as a whole GPU until then)."""
    req = run.request
    if req.shape == "mig":
        return req.gpus * mig_share(req.mig or "")
    if req.shape == "shared":
        return req.gpu_fraction if req.gpu_fraction is not None else 1.0
    return float(req.gpus * req.nodes)


def _place_shared(
    cap: Capacity,
    nodes: list[Node],
    req: ResourceRequest,
    gpu_type: str,
    fits: NodeFilter | None,
    fgd: bool = False,
) -> Placement | None:
    mem = req.gpu_memory_mb
    best: tuple[float, float, float, str, str, Node, float] | None = None
    for n in nodes:
        if fits is not None and not fits(n, len(cap.free[n.name])):
            continue
        if req.gpu_fraction is not None:
            frac = req.gpu_fraction
        elif mem is not None and n.gpu_memory_mb:
            frac = min(mem / n.gpu_memory_mb, 1.0)  # memory-only: charged its memory's share
        else:
            continue  # a memory cap needs a node that says how much memory a GPU has
        held = cap.shared.get(n.name, {})
        for dev in n.devices:
            if dev in held:
                used_f, used_m = held[dev]
            elif dev in cap.free[n.name]:
                used_f, used_m = 0.0, 0
            else:
                continue  # held whole by another run
            if used_f + frac > 1.0 + 1e-9:
                continue
            if mem is not None and (n.gpu_memory_mb is None or used_m + mem > n.gpu_memory_mb):
                continue
            left = 1.0 - used_f - frac
            score = (0.0, 0.0)
            if fgd:
                sig, had = cap.signature(n.name), round(1.0 - used_f, 6)
                after = after_share(sig, had, frac, req.cpu_milli, req.host_memory_mb)
                score = _score(cap, sig, after)
            fit = 0.0 if fgd else left  # best fit without fragmentation scores
            if best is None or (*score, fit, n.name, dev) < best[:5]:
                best = (*score, fit, n.name, dev, n, frac)
    if best is None:
        return None
    dev, node, frac = best[4], best[5], best[6]
    return Placement(node.backend, gpu_type, (_slot(req, node.name, (dev,), frac),))


def _place_mig(
    cap: Capacity, nodes: list[Node], req: ResourceRequest, gpu_type: str, fits: NodeFilter | None
) -> Placement | None:
    assert req.mig is not None
    cands = []
    for n in nodes:
        free = cap.mig_free[n.name].get(req.mig, [])
        left = len(free) - req.gpus
        if left >= 0 and (fits is None or fits(n, len(cap.free[n.name]))):
            cands.append((n, left))
    if not cands:
        return None
    node, _ = _best(cands)[0]
    ids = tuple(cap.mig_free[node.name][req.mig][: req.gpus])
    return Placement(node.backend, gpu_type, (_slot(req, node.name, ids, mig_share(req.mig)),))


def empty_cluster(
    nodes: tuple[Node, ...], capabilities: Mapping[str, BackendCapabilities]
) -> tuple[Snapshot, Capacity]:
    """The cluster of ``nodes`` with nothing running and every node schedulable (nodes that
    are unschedulable now may come back): ``place`` on it says whether a run could ever fit,
    judging the cluster's shape, not its state (``place`` changes nothing: one serves many)."""
    empty = Snapshot(
        now=0.0,
        nodes=tuple(n if n.schedulable else replace(n, schedulable=True) for n in nodes),
        pending=(),
        active=(),
        projects={},
        gpu_types={},
        priority_classes={},
        capabilities=capabilities,
    )
    return empty, Capacity(empty)
