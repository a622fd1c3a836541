"""CPU-only runs (``gpus`` 0: host CPU and/or memory on one node) on the native engine are the
Python core's (``placement._place_cpu``, quota, preemption, reasons and ETAs): hand-built
snapshots decided by ``decide`` (the reference), each pinned to its expected outcome, and by
the native engine loaded with the same active and pending runs, which must admit, place,
preempt and explain alike. (The random scenarios of ``test_native_core`` and
``test_native_fragmentation`` draw CPU-only runs too.)
"""

from __future__ import annotations

from typing import Any

import pytest

from mlops_gpu.core import ReasonCode
from mlops_gpu.model import NodeSlot, Phase, Placement, Run
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from tests.core.cases import native_decides

A100 = "a100-80gb"


@pytest.fixture(scope="module")
def native(native_module: Any) -> Any:
    return native_module


def holding(
    run_id: str, node: str, devices: tuple[str, ...] = (), *, cpu: int = 0, **kw: Any
) -> Run:
    """An active run holding ``devices`` (none: CPU-only) and ``cpu`` millicores on ``node``."""
    slot = NodeSlot(node, devices, cpu_milli=cpu)
    return make_run(
        run_id,
        gpus=len(devices),
        cpu_milli=cpu,
        phase=Phase.RUNNING,
        placement=Placement("local", A100, (slot,)),
        admitted_at=500.0,
        started_at=500.0,
        **kw,
    )


@pytest.mark.parametrize("placement", ["fragmentation", "best-fit"])
def test_a_cpu_only_run_goes_where_it_strands_no_gpu(native: Any, placement: str) -> None:
    # 'full' has no free GPU (CPU taken there strands nothing); 'empty' keeps its CPU; 'tiny'
    # lacks the CPU
    nodes = [
        make_node("empty", 2, cpu_milli=16000),
        make_node("full", 2, cpu_milli=16000),
        make_node("tiny", 2, cpu_milli=4000),
    ]
    busy = holding("busy", "full", ("0", "1"))
    snap = make_snapshot(
        nodes,
        # (busy uses the project's whole quota: a CPU-only run is charged none, so it fits)
        [make_project(nominal=2, borrowing_limit=0)],
        [make_run("c", gpus=0, cpu_milli=8000)],
        [busy],
        placement=placement,
    )
    d = native_decides(native, snap)
    (adm,) = d.admissions
    assert adm.placement.node_names == ("full",) and adm.placement.gpu_amount == 0


def test_a_cpu_only_run_preempts_for_host_cpu_and_waits_for_memory(native: Any) -> None:
    # One node, 16 cores: a low run holds 12; a high run asking 8 takes them back (losing no
    # GPU-seconds); a run asking more memory than any node has can never start.
    nodes = [make_node("n", 4, cpu_milli=16000, host_memory_mb=64000)]
    low = holding("low", "n", cpu=12000, priority="low")
    snap = make_snapshot(
        nodes,
        [make_project(nominal=4)],
        [
            make_run("high", gpus=0, cpu_milli=8000, priority="high", seq=1),
            make_run("huge", gpus=0, host_memory_mb=128000, seq=2),
        ],
        [low],
    )
    d = native_decides(native, snap)
    assert [a.run_id for a in d.admissions] == ["high"]
    [p] = d.preemptions
    assert (p.run_id, p.for_run, p.lost_gpu_s) == ("low", "high", 0.0)
    [why] = d.pending
    assert why.run_id == "huge" and why.reason_code is ReasonCode.UNSCHEDULABLE


def test_a_cpu_only_run_short_of_cpu_is_explained_alike(native: Any) -> None:
    # The node's CPU is held by a run that cannot be preempted: the CPU-only run waits for
    # capacity (its ETA: its GPU need, none, is met at once)
    nodes = [make_node("n", 4, cpu_milli=8000)]
    keeper = holding("keeper", "n", ("0",), cpu=6000, preemptible=False, max_runtime_s=900.0)
    snap = make_snapshot(
        nodes,
        [make_project(nominal=4)],
        [make_run("c", gpus=0, cpu_milli=4000, priority="high")],
        [keeper],
    )
    d = native_decides(native, snap)
    assert not d.admissions and not d.preemptions
    [why] = d.pending
    assert why.reason_code is ReasonCode.NO_CAPACITY and "4000m CPU" in why.reason
