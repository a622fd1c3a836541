"""Host CPU and memory, CPU-only runs and fragmentation-aware placement in the core: exact
placements and reasons on hand-built snapshots."""

from __future__ import annotations

import pytest

from mlops_gpu.core import Snapshot, decide
from mlops_gpu.model import Node, Phase, Run
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from mlops_gpu.testing.builders import placed

RUNNING = Phase.RUNNING


def snap(
    nodes: list[Node], pending: list[Run], active: list[Run] = (), placement: str = "fragmentation"
) -> Snapshot:
    project = make_project(nominal=16, borrowing_limit=0)
    return make_snapshot(nodes, [project], pending, list(active), placement=placement)


def where(s: Snapshot) -> dict[str, tuple[str, tuple[str, ...]]]:
    out = {}
    for a in decide(s).admissions:
        out[a.run_id] = (a.placement.slots[0].node, a.placement.slots[0].devices)
    return out


@pytest.mark.parametrize("placement", ["fragmentation", "best-fit"])
def test_a_node_without_the_cpu_is_skipped(placement: str) -> None:
    nodes = [make_node("small", 4, cpu_milli=2000), make_node("big", 4, cpu_milli=64000)]
    s = snap(nodes, [make_run("a", gpus=1, cpu_milli=8000)], placement=placement)
    assert where(s) == {"a": ("big", ("0",))}


def test_a_run_asking_more_host_memory_than_any_node_waits_with_the_reason() -> None:
    s = snap([make_node("n", 4, host_memory_mb=1024)], [make_run("a", host_memory_mb=4096)])
    d = decide(s)
    assert not d.admissions
    assert "4096 MB memory" in d.pending[0].reason


def test_cpu_only_runs_go_where_no_gpu_is_stranded() -> None:
    # 'full' has no free GPU: CPU taken there strands nothing; 'empty' keeps its CPU.
    nodes = [make_node("empty", 2, cpu_milli=16000), make_node("full", 2, cpu_milli=16000)]
    busy = make_run("busy", gpus=2, phase=RUNNING, placement=placed("full", ["0", "1"]))
    s = snap(nodes, [make_run("c", gpus=0, cpu_milli=8000)], [busy])
    assert where(s) == {"c": ("full", ())}
    (adm,) = decide(s).admissions
    assert adm.placement.gpu_amount == 0 and adm.placement.slots[0].cpu_milli == 8000


@pytest.mark.parametrize(("placement", "device"), [("fragmentation", "0"), ("best-fit", "1")])
def test_a_share_goes_where_the_clusters_shapes_can_use_what_is_left(
    placement: str, device: str
) -> None:
    # Device 1 holds a 0.5 share; the mix is 0.5-shares. Best fit fills device 1 (0.25 left,
    # which no 0.5-share can use); fragmentation-aware placement opens device 0 instead (0.75
    # and 0.5 left: both still take a 0.5-share).
    nodes = [make_node("n", 2, shared=True)]
    half = make_run(
        "half", phase=RUNNING, gpu_fraction=0.5, placement=placed("n", ["1"], fraction=0.5)
    )
    s = snap(nodes, [make_run("q", gpu_fraction=0.25)], [half], placement=placement)
    assert where(s) == {"q": ("n", (device,))}


def test_cpu_only_request_shape_is_validated() -> None:
    assert make_run("c", gpus=0).request.problems()  # no CPU or memory: not a CPU-only run
    assert make_run("c", gpus=0, cpu_milli=1000).request.problems() == []
    assert make_run("c", gpus=0, cpu_milli=1000, nodes=2).request.problems()
