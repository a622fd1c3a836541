"""Which GPU type a run that accepts several goes to under fragmentation-aware placement
(``core.type_choice``): exact placements on hand-built snapshots, and the per-type figures
the choice reads (``Mix.restricted``, ``Capacity.free_by_type``)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from mlops_gpu.core import decide
from mlops_gpu.core.capacity import Capacity
from mlops_gpu.core.fragmentation import Mix
from mlops_gpu.model import Phase, Project, Quota, Run
from mlops_gpu.testing import make_node, make_run, make_snapshot
from mlops_gpu.testing.builders import placed

NODES = [
    make_node("scarce", 2, gpu_type="t4", cpu_milli=32000),
    make_node("big-0", 8, gpu_type="g2", cpu_milli=96000),
    make_node("big-1", 8, gpu_type="g2", cpu_milli=96000),
]
PROJECT = Project("p", quotas=MappingProxyType({"t4": Quota(16, 0), "g2": Quota(16, 0)}))


def holder(accepts: tuple[str, ...]) -> Run:
    """A 1-GPU run accepting ``accepts`` (empty: any type), holding device 0 of 'scarce'
    (of 'big-1' when it accepts g2 only)."""
    node, gpu_type = ("big-1", "g2") if accepts == ("g2",) else ("scarce", "t4")
    return make_run(
        "holder",
        phase=Phase.RUNNING,
        gpu_types=accepts,
        placement=placed(node, ["0"], gpu_type=gpu_type),
    )


@pytest.mark.parametrize(
    ("holder_accepts", "run_accepts", "gpus", "node"),
    [
        # Nothing restricted is active: the growth of fragmentation is the same class on both
        # types (no growth), and so is the CPU balance: the node name decides, as in FGD.
        pytest.param((), ("t4", "g2"), 1, "big-0", id="no-restricted-run-ties-by-name"),
        # A t4-only run holds t4: t4 has no headroom left, g2 has 16 GPUs of it.
        pytest.param(("t4",), ("t4", "g2"), 1, "big-0", id="t4-only-run-active-goes-to-g2"),
        pytest.param(("t4",), ("g2", "t4"), 1, "big-0", id="listed-order-does-not-matter"),
        # A run that accepts both types counts half on each: t4 headroom 0.5, g2 15.5.
        pytest.param(("g2", "t4"), ("t4", "g2"), 1, "big-0", id="split-restriction-still-g2"),
        # A type with no placement for the run comes last whatever its headroom.
        # A g2-only run is active. Fragmentation growth alone would pick t4 (the g2-only
        # shape counts t4's free GPUs as fragment, so taking one there shrinks it); headroom
        # (t4 2, g2 15 - 1) sends the run to g2, where no growth on either node: by name.
        pytest.param(("g2",), ("t4", "g2"), 1, "big-0", id="g2-only-run-active-headroom-wins"),
        pytest.param(("g2",), ("t4", "g2"), 8, "big-0", id="only-g2-fits-eight"),
    ],
)
def test_type_choice(
    holder_accepts: tuple[str, ...], run_accepts: tuple[str, ...], gpus: int, node: str
) -> None:
    run = make_run("r", gpus=gpus, gpu_types=run_accepts, cpu_milli=4000)
    s = make_snapshot(NODES, [PROJECT], [run], [holder(holder_accepts)])
    (adm,) = decide(s).admissions
    assert adm.placement.slots[0].node == node


def test_a_cpu_only_run_ignores_headroom() -> None:
    # CPU-only: headroom (t4 1 - 1 = 0, g2 8) would send it to g2; without it, the types tie
    # on fragmentation growth and CPU balance, and the node name decides: the t4 node, even
    # though t4-only runs are active there.
    nodes = [
        make_node("a-t4", 2, gpu_type="t4", cpu_milli=32000),
        make_node("b-g2", 8, gpu_type="g2", cpu_milli=96000),
    ]
    run = make_run("c", gpus=0, cpu_milli=4000)
    t4_only = make_run(
        "holder", phase=Phase.RUNNING, gpu_types=("t4",), placement=placed("a-t4", ["0"], "t4")
    )
    s = make_snapshot(nodes, [PROJECT], [run], [t4_only])
    (adm,) = decide(s).admissions
    assert adm.placement.slots[0].node == "a-t4"


def test_restricted_demand_splits_over_distinct_types_and_undoes_exactly() -> None:
    mix = Mix()
    mix.add((1, 1.0, 0, 0, ()))  # any type: not restricted
    mix.add((2, 1.0, 0, 0, ("t4",)))
    mix.add((1, 0.5, 0, 0, ("g2", "t4", "t4")))  # a repeated type counts once
    assert mix.restricted() == {"t4": 2.25, "g2": 0.25}
    mix.remove((2, 1.0, 0, 0, ("t4",)))
    assert mix.restricted() == {"t4": 0.25, "g2": 0.25}
    mix.remove((1, 0.5, 0, 0, ("g2", "t4", "t4")))
    assert mix.restricted() == {}


def test_free_by_type_follows_take_and_release() -> None:
    cap = Capacity(make_snapshot(NODES, [PROJECT]))
    assert (cap.free_by_type("t4"), cap.free_by_type("g2")) == (2.0, 16.0)
    p = placed("big-1", ["0", "1", "2"], gpu_type="g2")
    cap.take("p", p, ("g2",))
    assert cap.free_by_type("g2") == 13.0 and cap.mix.restricted() == {"g2": 3.0}
    cap.release("p", p, ("g2",))
    assert cap.free_by_type("g2") == 16.0 and cap.mix.restricted() == {}
    assert cap.free_by_type("a100") == 0.0
