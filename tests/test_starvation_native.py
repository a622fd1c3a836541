"""The starvation property of ``tests/core/test_starvation_property.py`` on the native engine
(>= 500 examples): a target behind a stream the order prefers starts by the time the runs holding
resources when it became the anchor have ended."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from mlops_gpu.core.native import NativeEngine
from tests.core.test_starvation_property import _check, worlds


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=worlds())
def test_target_starts_within_the_bound_native(native_module: Any, w: dict[str, Any]) -> None:
    _check(NativeEngine(w["template"], native_module), w)
