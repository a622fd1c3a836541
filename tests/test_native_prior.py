"""A shape prior (``Snapshot.shape_prior``) of any finite counts, whole or not, its shapes'
GPU types in any order: both engines weigh it alike (``core/fragmentation.py``'s ``Mix``,
``native/src/fragmentation.rs``), where the native engine once refused it
(``native_support.unsupported``) and the packing simulator then ran on Python.

The rule both follow: a prior shape is keyed by its GPU types sorted (as an active run's slot
shape is), two shapes equal but for that order are one with their counts summed in the
prior's order, and every sum of counts runs in the ranked order (count descending, then
shape). Summing the counts in the prior's (the dict's) order on the Python side alone was
checked to fail ``test_the_order_of_the_prior_changes_nothing`` (the coverage cut then keeps
or drops the 4-GPU shape by the last bit of the sum: 19 + 0.6 + 0.3 + 0.1 is 20 plus an ulp,
0.1 + 0.3 + 0.6 + 19 is 20); keying a prior shape by its types unsorted on the Python side
fails ``test_a_prior_shape_is_keyed_by_its_sorted_types``. On the Rust side, the last count
of a shape winning over the sum fails ``cargo test``'s
``a_prior_shape_is_keyed_by_its_sorted_types_and_its_counts_need_not_be_whole``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_native_core import replay

from mlops_gpu.core.fragmentation import Mix
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot

A = "a100-80gb"
BIG, FOUR, TWO_HALF, ONE_HALF = (
    (1, 1.0, 0, 0, ()),
    (4, 1.0, 0, 0, ()),
    (2, 0.5, 0, 0, ()),
    (1, 0.5, 0, 0, ()),
)


@pytest.fixture(scope="module")
def native(native_module: Any) -> Any:
    return native_module


@pytest.mark.parametrize("order", ["small_first", "large_first"])
def test_the_order_of_the_prior_changes_nothing(native: Any, order: str) -> None:
    """The 4-GPU shape is in the weights (19 of 20 is not yet 95% of the ranked sum), so a
    1-GPU run goes to the 2-GPU node (the 4-GPU node would no longer fit it), whichever order
    the prior lists its shapes in, on both engines."""
    counts = [(ONE_HALF, 0.1), (TWO_HALF, 0.3), (FOUR, 0.6), (BIG, 19.0)]
    if order == "large_first":
        counts.reverse()
    nodes = [make_node("n0", 4, A, cpu_milli=64000), make_node("n1", 2, A, cpu_milli=64000)]
    template = make_snapshot(nodes, [make_project("p0")], now=0.0, placement="fragmentation")
    template = replace(template, shape_prior=dict(counts))
    events: list[tuple[Any, ...]] = [("submit", make_run("r", "p0", 1, seq=1)), ("cycle", None)]
    assert replay(native, template, events) == 1
    events += [("submit", make_run("s", "p0", 2, seq=2)), ("cycle", None)]
    assert replay(native, template, events) == 2
    placed = Mix(template.shape_prior)
    assert [s for s, _ in placed.weights()] == [BIG, FOUR]


def test_a_prior_shape_is_keyed_by_its_sorted_types(native: Any) -> None:
    """Split in two by the order of its types, a shape weighs as one with the counts summed
    (in the prior's order); both engines decide alike on either prior."""
    ha, ah = (2, 1.0, 0, 0, ("h100-80gb", A)), (2, 1.0, 0, 0, (A, "h100-80gb"))
    split = Mix({BIG: 9.0, ha: 0.5, FOUR: 0.6, ah: 0.4})
    merged = Mix({BIG: 9.0, ah: 0.5 + 0.4, FOUR: 0.6})
    assert split.prior == merged.prior == {BIG: 9.0, ah: 0.9, FOUR: 0.6}
    assert split.weights() == merged.weights() == ((BIG, 0.857), (ah, 0.086), (FOUR, 0.057))
    nodes = [make_node("n0", 4, A, cpu_milli=64000), make_node("n1", 2, A, cpu_milli=64000)]
    template = make_snapshot(nodes, [make_project("p0")], now=0.0, placement="fragmentation")
    events: list[tuple[Any, ...]] = [
        ("submit", make_run("r", "p0", 1, seq=1)),
        ("cycle", None),
        ("submit", make_run("s", "p0", 1, seq=2, gpu_types=("h100-80gb", A))),
        ("cycle", None),
        ("finish", 0, False),
        ("cycle", None),
    ]
    for prior in (split.prior, {BIG: 9.0, ha: 0.5, FOUR: 0.6, ah: 0.4}):
        assert replay(native, replace(template, shape_prior=prior), events) == 2
