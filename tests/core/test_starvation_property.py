"""Issue 24 item 1, as a property of the core: on a random small cluster with random running
runs (some with, some without max_runtime, each with a true finite duration), a target run that
fits the empty cluster (a whole node or a part of one), submitted behind a steady stream of
arrivals that the order prefers (shorter max_runtime, a lower LAS level, same class, same
project; up to half the cluster a step, at times all of one duration, so that a target that fits
as each cycle begins is overtaken cycle after cycle), starts no later than the time the runs
holding resources when it became the anchor have ended (counting a run with max_runtime as
ending at it: EASY backfill trusts max_runtime), plus one cycle (``tests/core/starvation.py``).
Under every order, fair share on and off, quota equal to the cluster (as ``mlops-gpu init``
writes it) or larger; on the Python reference and on the native engine
(``tests/test_starvation_native.py``)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import Quota, Run
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from tests.core.starvation import drive

T = "a100-80gb"


@st.composite
def worlds(draw: st.DrawFn) -> dict[str, Any]:
    sizes = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3))
    total = sum(sizes)
    order = draw(st.sampled_from(["shortest", "submit", "las"]))
    fair = draw(st.booleans())
    nominal = draw(st.sampled_from([total, total, 2 * total]))  # == the cluster: init's
    template = make_snapshot(
        [make_node(f"n{i}", g) for i, g in enumerate(sizes)],
        [make_project("p", quotas={T: Quota(nominal, 0)})],
        now=0.0,
        order=order,
        fair_share=fair,
    )
    target_mr = draw(st.sampled_from([None, 50.0, 200.0]))
    target = make_run(
        "target",
        "p",
        gpus=draw(st.integers(1, max(sizes))),
        seq=1000,
        max_runtime_s=target_mr,
        # under las: a later level than the arrivals', which the order then prefers
        attained_gpu_s=4000.0 if order == "las" else 0.0,
    )
    holders = []
    for i in range(draw(st.integers(1, total))):
        duration = float(draw(st.integers(1, 20)))
        mr = draw(st.sampled_from([None, duration, duration + 10.0]))
        holders.append((make_run(f"h{i}", "p", seq=i, max_runtime_s=mr), duration))
    stream_mr = draw(st.sampled_from([None, 5.0]) if target_mr is None else st.just(5.0))
    every = draw(st.integers(1, 2))
    return {
        "template": template,
        "holders": holders,
        "target": target,
        # up to half the cluster's GPUs a step: enough to take every GPU that frees, so that a
        # target that fits as each cycle begins (a part of a node) is overtaken, again and again
        # (and of one true duration, at times: then as many GPUs free at each cycle's start)
        "stream": (
            stream_mr,
            every,
            draw(st.integers(1, 2)),
            draw(st.integers(1, total // 2)),
            draw(st.sampled_from([None, 1.0, 2.0, 3.0])),
        ),
    }


def _arrivals(stream: tuple[float | None, int, int, int, float | None]) -> Any:
    mr, every, gpus, burst, duration = stream

    def arrivals(step: int, now: float) -> list[tuple[Run, float]]:
        if step % every:
            return []
        return [
            (
                make_run(
                    f"s{step}-{k}",
                    "p",
                    gpus=gpus,
                    seq=2000 + 10 * step + k,
                    submitted_at=now,
                    max_runtime_s=mr,
                ),
                float(1 + (step + k) % 4) if duration is None else duration,
            )
            for k in range(burst)
        ]

    return arrivals


def _check(engine: Any, w: dict[str, Any]) -> None:
    out = drive(engine, w["holders"], w["target"], _arrivals(w["stream"]), horizon=120.0)
    assert out.started is not None, (out, w["template"].policy)
    assert out.bound is None or out.started <= out.bound, (out, w["template"].policy)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_target_starts_within_the_bound_python(w: dict[str, Any]) -> None:
    _check(FromScratch(w["template"]), w)
