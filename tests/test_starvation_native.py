"""The starvation property of ``tests/core/test_starvation_property.py`` on the native engine
(>= 500 examples): a target behind a stream the order prefers starts by the time the runs holding
resources when it became the anchor have ended."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from mlops_gpu.engines.native import NativeEngine
from tests.core.starvation import drive
from tests.core.test_starvation import (
    _partial_node,
    preempt_around_the_anchor,
    preempt_template,
    quota_template,
)
from tests.core.test_starvation_property import _check, worlds


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=worlds())
def test_target_starts_within_the_bound_native(native_module: Any, w: dict[str, Any]) -> None:
    _check(NativeEngine(w["template"], native_module), w)


@pytest.mark.parametrize("order", ["shortest", "las"])
def test_overtaken_partial_node_run_becomes_the_anchor_native(
    native_module: Any, order: str
) -> None:
    template, holders, target, arrivals = _partial_node(order)
    out = drive(NativeEngine(template, native_module), holders, target, arrivals, horizon=60.0)
    assert out.started is not None, f"never started; {out.overtaken} later runs went first"
    assert out.bound is not None and out.started <= out.bound, out
    assert out.started <= 3.0, out


def test_preemptors_and_the_anchors_reserved_gpus_native(native_module: Any) -> None:
    d = preempt_around_the_anchor(NativeEngine(preempt_template(), native_module), "normal")
    assert d.admissions == () and d.preemptions == (), d
    d = preempt_around_the_anchor(NativeEngine(preempt_template(), native_module), "high")
    assert [a.run_id for a in d.admissions] == ["mid"], d
    assert sorted(p.run_id for p in d.preemptions) == ["low0", "low1"], d
    d = preempt_around_the_anchor(NativeEngine(quota_template(), native_module), "normal", "local")
    assert d.admissions == () and d.preemptions == (), d
    d = preempt_around_the_anchor(NativeEngine(quota_template(), native_module), "high", "local")
    assert [a.run_id for a in d.admissions] == ["mid"], d
