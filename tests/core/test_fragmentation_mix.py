"""The fragmentation mix (``core.fragmentation.Mix``) as FGD's typical pods: the shapes that
cover 95% of the runs, a prior of expected shapes (``Snapshot.shape_prior``) added to the
active runs', and the integer growth classes (``placement.growth_class``) with ties by node
name."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from mlops_gpu.core import decide
from mlops_gpu.core.fragmentation import Mix, Shape
from mlops_gpu.core.placement import growth_class
from mlops_gpu.model import Project, Quota
from mlops_gpu.testing import make_node, make_run, make_snapshot

ONE: Shape = (1, 1.0, 4000, 0, ())
PAIR: Shape = (2, 1.0, 4000, 0, ())
T4_HALF: Shape = (1, 0.5, 4000, 0, ("t4",))


def test_rare_shapes_below_the_coverage_are_left_out() -> None:
    mix = Mix()
    for _ in range(96):
        mix.add(ONE)
    for _ in range(4):
        mix.add(PAIR)
    # ONE alone covers 96% of the runs: the 4% of pairs are not weighed
    assert mix.weights() == ((ONE, 1.0),)
    for _ in range(2):
        mix.add(PAIR)  # 6 of 102: ONE covers 94%, so pairs come in
    assert dict(mix.weights()) == {ONE: round(96 / 102, 3), PAIR: round(6 / 102, 3)}


def test_the_prior_adds_to_the_weights_but_not_to_restricted_demand() -> None:
    mix = Mix({PAIR: 30.0, T4_HALF: 10.0})
    for _ in range(60):
        mix.add(ONE)
    assert dict(mix.weights()) == {ONE: 0.6, PAIR: 0.3, T4_HALF: 0.1}
    assert mix.restricted() == {}  # only active runs hold GPUs of a type
    mix.add(T4_HALF)
    assert mix.restricted() == {"t4": 0.5}


def test_growth_classes_are_fgds_integer_scores() -> None:
    assert growth_class(0.0) == -50
    assert growth_class(-1.0) == -73  # a fall of one GPU of fragmentation: score 73
    assert growth_class(0.01) == growth_class(0.02) == -49  # small growths tie
    assert growth_class(0.5) == -37


PROJECT = Project("p", quotas=MappingProxyType({"t4": Quota(16, 0)}))
NODES = [
    make_node("a", 2, gpu_type="t4", cpu_milli=32000),
    make_node("b", 1, gpu_type="t4", cpu_milli=32000),
]


def test_a_shape_prior_steers_placement_where_no_run_is_active_yet() -> None:
    run = make_run("r", gpus=1, gpu_types=("t4",), cpu_milli=4000)
    snap = make_snapshot(NODES, [PROJECT], [run])
    # no active run, no prior: nothing to weigh; no growth anywhere, so the name decides
    (adm,) = decide(snap).admissions
    assert adm.placement.slots[0].node == "a"
    # pairs are expected: taking a GPU of "a" breaks its pair; "b" could never host one
    (adm,) = decide(replace(snap, shape_prior=MappingProxyType({PAIR: 5.0}))).admissions
    assert adm.placement.slots[0].node == "b"


def test_up_to_128_shapes_are_weighed_before_the_cover_is_cut() -> None:
    mix = Mix()
    for cpu in range(100):  # 100 shapes, one run each: the 95% cover takes 95 of them
        mix.add((1, 1.0, 1000 + cpu, 0, ()))
    assert len(mix.weights()) == 95
    for cpu in range(100, 200):
        mix.add((1, 1.0, 1000 + cpu, 0, ()))
    assert len(mix.weights()) == 128  # 190 would cover 95%: the cap cuts first
