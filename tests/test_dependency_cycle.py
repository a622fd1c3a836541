"""The store's cycle check (``state.jobs._check_acyclic``). No surface can make a cycle (a
dependency names a run that exists before the submit and never changes), so the check is
tested here directly: a batch whose runs would wait for one another is refused, one line."""

from __future__ import annotations

import pytest

from mlops_gpu.model import Dependency
from mlops_gpu.state.errors import DependencyError
from mlops_gpu.state.jobs import _check_acyclic
from mlops_gpu.testing import make_spec


def specs(*deps: tuple[str, ...]) -> list:  # type: ignore[type-arg]
    return [make_spec(dependencies=tuple(Dependency("afterok", d) for d in ds)) for ds in deps]


@pytest.mark.parametrize(
    "ids,deps",
    [
        (["a"], [("a",)]),  # waits for itself
        (["a", "b"], [("b",), ("a",)]),
        (["a", "b", "c"], [("c",), ("a",), ("b",)]),
        (["a", "b", "c", "d"], [(), ("a", "d"), ("b",), ("c",)]),  # b -> d -> c -> b
    ],
    ids=["self", "two", "three", "behind-a-fork"],
)
def test_a_cycle_is_refused(ids: list[str], deps: list[tuple[str, ...]]) -> None:
    with pytest.raises(DependencyError, match=r"^dependency cycle: run \w would wait for itself$"):
        _check_acyclic(ids, specs(*deps))


def test_chains_forks_and_outside_ids_pass() -> None:
    _check_acyclic(["a", "b", "c"], specs((), ("a",), ("a", "b")))
    _check_acyclic(["a", "b"], specs(("r0000000001",), ("r0000000001", "a")))
    _check_acyclic([], [])
