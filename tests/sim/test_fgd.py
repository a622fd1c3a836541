"""The FGD baseline (``sim.fgd``) on hand-computed nodes: its typical shapes, a node's
fragmentation per shape and in expectation, the integer score, the GPU it picks inside a node
and the node it picks in a cluster (ties to the smallest name; memory a filter, not a score)."""

from __future__ import annotations

import math
import random

import pytest

from mlops_gpu.model import Node
from mlops_gpu.sim.fgd import (
    FgdPlacer,
    Shape,
    node_frag,
    node_score,
    shape_frag,
    sigmoid_score,
    state_of,
    typical_pods,
)
from mlops_gpu.sim.openb import Pod
from mlops_gpu.sim.packing import Cluster, replay


def pod(name: str, num_gpu: int, milli: int = 1000, cpu: int = 1000, spec: str = "",
        mem: int = 1024) -> Pod:  # fmt: skip
    accepts = tuple(s for s in spec.split("|") if s)
    return Pod(name, cpu, mem, num_gpu, milli if num_gpu else 0, accepts)


def node(name: str, gpus: int, cpu: int = 32000, mem: int = 131072, model: str = "T4") -> Node:
    return Node(name, "sim", model, tuple(str(i) for i in range(gpus)), shared=True,
                cpu_milli=cpu, host_memory_mb=mem)  # fmt: skip


WHOLE1: Shape = (4000, 1000, 1, "")
WHOLE2: Shape = (4000, 1000, 2, "")
WHOLE3: Shape = (4000, 1000, 3, "")
HALF: Shape = (4000, 500, 1, "")
FIFTH: Shape = (4000, 200, 1, "")
CPU: Shape = (4000, 0, 0, "")


def test_typical_shapes_cover_95_percent_by_count_then_renormalise() -> None:
    pods = [pod(f"a{i}", 1, 500) for i in range(5)] + [pod(f"b{i}", 1) for i in range(3)]
    pods += [pod("c", 2), pod("d", 0)]
    # 5, 3, 1, 1 of 10: 90% after three shapes, so all four are typical, at their frequency
    got = dict(typical_pods(pods))
    assert got == {
        (1000, 500, 1, ""): 0.5,
        (1000, 1000, 1, ""): 0.3,
        (1000, 1000, 2, ""): 0.1,
        (1000, 0, 0, ""): 0.1,  # CPU-only pods are typical shapes too
    }
    # at 80%, two shapes cover it: their shares are renormalised to sum to 1
    assert dict(typical_pods(pods, threshold=80)) == {
        (1000, 500, 1, ""): pytest.approx(5 / 8),
        (1000, 1000, 1, ""): pytest.approx(3 / 8),
    }
    # equal counts: the larger shape comes first, so it is the one kept at the cut
    tie = [pod("x", 1, cpu=2000), pod("y", 1, cpu=1000)]
    assert typical_pods(tie, threshold=50) == (((2000, 1000, 1, ""), 1.0),)


def test_shape_fragment_by_hand() -> None:
    state = state_of([1000, 1000, 300, 0], 8000, "T4")  # 2.3 GPUs free
    assert shape_frag(state, WHOLE1) == 300  # fits: the partly used GPU is the fragment
    assert shape_frag(state, WHOLE2) == 300
    assert shape_frag(state, WHOLE3) == 2300  # lacks GPUs: all of it
    assert shape_frag(state, HALF) == 300
    assert shape_frag(state, FIFTH) == 0  # 300 left can take a fifth
    assert shape_frag(state, (9000, 500, 1, "")) == 2300  # lacks CPU
    assert shape_frag(state, (4000, 500, 1, "V100")) == 2300  # a model it does not serve
    assert shape_frag(state, (4000, 500, 1, "V100|T4")) == 300
    assert shape_frag(state, CPU) == 2300  # a CPU-only shape counts all free GPU
    assert shape_frag(state_of([0, 0], 8000, "T4"), WHOLE1) == 0  # nothing free, no fragment


def test_node_fragmentation_is_the_popularity_weighted_sum() -> None:
    state = state_of([1000, 1000, 300, 0], 8000, "T4")
    typical = ((WHOLE1, 0.5), (HALF, 0.25), (CPU, 0.25))
    assert node_frag(state, typical) == pytest.approx(0.5 * 300 + 0.25 * 300 + 0.25 * 2300)


def test_integer_score_is_the_framework_sigmoid() -> None:
    assert sigmoid_score(0.0, 0.0) == 50
    assert sigmoid_score(1000.0, 0.0) == int(100 / (1 + math.exp(-1))) == 73
    assert sigmoid_score(0.0, 500.0) == 37  # 100 * sigmoid(-0.5) = 37.75, truncated
    assert sigmoid_score(0.0, 10.0) == 49  # any growth at all drops below 50


def test_a_share_goes_to_the_gpu_that_grows_fragmentation_least_not_the_tightest() -> None:
    typical = ((HALF, 1.0),)
    frag = lambda s: node_frag(s, typical)  # noqa: E731
    # 0.4 on [1.0, 0.6]: on GPU 0 it leaves [0.6, 0.6] (both can take a half: frag 0, score
    # 50); on GPU 1 (best fit) it leaves 0.2 that no half can use (frag 200, score 45)
    assert node_score([1000, 600], 32000, "T4", (1000, 400, 1, ""), frag) == (50, (0,))
    # with 0.6-shares typical, GPU 1 (frag 100: score 47) beats GPU 0 (frag 500: score 37)
    frag6 = lambda s: node_frag(s, (((4000, 600, 1, ""), 1.0),))  # noqa: E731
    assert node_score([1000, 600], 32000, "T4", (1000, 500, 1, ""), frag6) == (47, (1,))
    # whole GPUs: the fully free devices of lowest index; a CPU-only pod takes none
    assert node_score([500, 1000, 1000], 32000, "T4", (1000, 1000, 1, ""), frag)[1] == (1,)
    assert node_score([500, 1000, 1000], 32000, "T4", (1000, 0, 0, ""), frag)[1] == ()


def place(nodes: list[Node], typical_from: list[Pod], todo: list[Pod]) -> list[str | None]:
    c, fgd, rng = Cluster(nodes), FgdPlacer(typical_from), random.Random(1)
    out: list[str | None] = []
    for p in todo:
        choice = fgd(c, p, rng)
        if choice is not None:
            c.book(choice, p)  # asserts the placement fits
        out.append(None if choice is None else c.nodes[choice[0]].name)
    return out


def test_the_node_minimising_fragmentation_growth_wins_ties_to_the_smallest_name() -> None:
    mix = [pod("h", 1, 500, cpu=4000)] * 3 + [pod("w", 2, cpu=4000)]
    # typical: halves 3/4, 2-GPU pods 1/4. A half on the 1-GPU node "z": its fragmentation
    # falls from 250 (2-GPU pods never fit there) to 125, score 53; on a 2-GPU node it breaks
    # the pair: 0 -> 0.25 x 1500 = 375, score 40
    assert place([node("b", 2), node("z", 1), node("a", 2)], mix, [pod("p", 1, 500)]) == ["z"]
    # same state: ties go to the smallest name, wherever it is in the list
    assert place([node("b", 2), node("a", 2)], mix, [pod("p", 1, 500)]) == ["a"]


def test_cpu_only_pods_go_where_they_strand_no_gpu_and_memory_is_only_a_filter() -> None:
    mix = [pod("g", 1, cpu=4000)]
    # "a" has free GPUs and 5 cores: 2 cores there leave 3, too few for the typical 1-GPU pod
    # (a growth of 2 GPUs); "b"'s GPU is taken, so its CPU strands nothing
    nodes = [node("a", 2, cpu=5000), node("b", 1, cpu=5000)]
    c, fgd, rng = Cluster(nodes), FgdPlacer(mix), random.Random(1)
    c.book((1, (0,), 1.0), pod("x", 1, cpu=1000))
    choice = fgd(c, pod("cpu", 0, cpu=2000), rng)
    assert choice is not None and c.nodes[choice[0]].name == "b"
    # memory is no part of FGD's score, but a node without it is filtered out
    low = [node("a", 2, mem=512), node("b", 2)]
    assert place(low, mix, [pod("p", 1, mem=1024)]) == ["b"]
    assert place([node("a", 1)], mix, [pod("p", 1), pod("q", 1)]) == ["a", None]


def test_fgd_replays_through_the_packing_harness() -> None:
    nodes = [node("a", 1), node("b", 1)]
    pods = [pod("p1", 1, 600), pod("p2", 1, 600), pod("p3", 1, 400), pod("p4", 1, 400)]
    r = replay("hand", nodes, pods, "fgd")
    # 0.6 and 0.6 on separate GPUs; each 0.4 fills one up: nothing fails
    assert (r.failed_pods, r.allocated_at[1.0]) == (0, pytest.approx(1.0))
