"""The openb loader (vendored files and malformed rows) and the packing replay: its marks, its
fragmentation measure and its placers on hand-checked clusters, the core's placements included."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mlops_gpu.engines.native import NotSupported
from mlops_gpu.model import Node
from mlops_gpu.sim.engines import ENGINES
from mlops_gpu.sim.openb import NODES_FILE, POD_FILES, Pod, load_nodes, load_openb, load_pods
from mlops_gpu.sim.packing import (
    Cluster,
    CorePlacer,
    best_fit,
    file_mix,
    file_shapes,
    first_fit,
    replay,
)
from mlops_gpu.sim.trace import TraceError

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time\n"
)


def write(tmp_path: Path, text: str, name: str = "pods.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def node(name: str, gpus: int, cpu: int = 32000, mem: int = 131072, model: str = "T4") -> Node:
    return Node(name, "sim", model, tuple(str(i) for i in range(gpus)), shared=True,
                cpu_milli=cpu, host_memory_mb=mem)  # fmt: skip


def pod(name: str, num_gpu: int, milli: int = 1000, cpu: int = 1000, spec: str = "") -> Pod:
    accepts = tuple(s for s in spec.split("|") if s)
    return Pod(name, cpu, 1024, num_gpu, milli if num_gpu else 0, accepts)


def test_vendored_files_load_with_the_published_counts() -> None:
    nodes = load_nodes(NODES_FILE)
    assert len(nodes) == 1213 and sum(n.capacity for n in nodes) == 6212
    assert len({n.gpu_type for n in nodes}) == 7 and all(n.shared for n in nodes)
    for f in POD_FILES.values():
        pods = load_pods(f)
        assert len(pods.pods) == 8152 and pods.cpu_only == 1088
    spec = load_pods(POD_FILES["gpuspec33"])
    assert sum(1 for p in spec.pods if p.gpu_spec) == 2388


def test_pod_shapes_become_requests() -> None:
    frac, whole, cpu = pod("f", 1, 460), pod("w", 2), pod("c", 0)
    assert frac.request().gpu_fraction == 0.46 and frac.gpu_demand == 0.46
    assert (whole.request().gpus, whole.request().gpu_fraction, whole.gpu_demand) == (2, None, 2)
    assert cpu.request().shape == "cpu" and cpu.gpu_demand == 0 and cpu.request().problems() == []


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ("p,1000,1024,1,1200,,LS,0,10", "gpu_milli: expected 1..1000"),
        ("p,1000,1024,2,500,,LS,0,10", "num_gpu: a fractional GPU"),
        ("p,x,1024,1,500,,LS,0,10", "column cpu_milli: expected a number"),
    ],
)
def test_malformed_pod_rows_name_file_line_and_column(tmp_path: Path, row: str, where: str) -> None:
    p = write(tmp_path, POD_HEADER + "ok,1000,1024,1,1000,,LS,0,10\n" + row + "\n")
    with pytest.raises(TraceError, match=rf"pods.csv:3: .*{where}"):
        load_pods(p)


def test_openb_trace_window_and_projects(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        POD_HEADER + "a,1000,1024,1,500,,LS,0,100\nb,1000,1024,0,0,,BE,86400,86500\n"
        "c,1000,1024,1,1000,T4|P100,LS,90000,\n",
    )
    t = load_openb(p, NODES_FILE, start_day=1, days=1)
    assert [(j.id, j.submit_s, j.duration_s, j.project, j.gpus) for j in t.jobs] == [
        ("b", 0.0, 100.0, "BE", 0)
    ]  # c has no deletion time
    assert len(t.nodes) == 1213


def test_replay_marks_failures_and_fragmentation_by_hand() -> None:
    # 2 nodes x 1 GPU (capacity 2): 0.6, 0.6 (second node), 0.6 fails (0.4 + 0.4 left), 0.4.
    nodes = [node("a", 1), node("b", 1)]
    pods = [pod("p1", 1, 600), pod("p2", 1, 600), pod("p3", 1, 600), pod("p4", 1, 400)]
    r = replay("hand", nodes, pods, "first-fit")
    # arrived 0.6, 1.2, 1.8 (>= 80% and 90% of 2: allocated 1.2), 2.2 (>= 100%: 1.6)
    assert r.allocated_at == {0.8: 0.6, 0.9: 0.6, 1.0: 0.8}
    assert (r.failed_pods, r.pods_drawn) == (1, 4)
    # first fit puts p4 on a, leaving 0.4 free on b; the mix is 3/4 0.6-shares (which
    # cannot use 0.4) and 1/4 0.4-shares (which can): 0.75 * 0.4 fragmented
    assert r.fragmented_gpus == pytest.approx(0.3)


def test_cpu_only_pods_take_host_resources_and_can_strand_gpus() -> None:
    c = Cluster([node("a", 2, cpu=4000)])
    c.book((0, (), 0.0), pod("cpu", 0, cpu=4000))
    assert not c.fits(0, pod("g", 1, cpu=1000))
    # every shape of the mix now finds no CPU: both free GPUs are fragmented
    assert c.fragmented(file_mix([pod("g", 1, cpu=1000)])) == pytest.approx(2.0)
    with pytest.raises(AssertionError):
        c.book((0, (0,), 1.0), pod("g", 1, cpu=1000))


def test_best_fit_prefers_the_fullest_node_and_device() -> None:
    c = Cluster([node("a", 2), node("b", 2)])
    c.book((1, (0,), 0.5), pod("x", 1, 500))
    rng = random.Random(1)
    assert first_fit(c, pod("y", 1, 300), rng) == (0, (0,), 0.3)
    assert best_fit(c, pod("y", 1, 300), rng) == (1, (0,), 0.3)  # the half-used device


def test_the_core_places_shares_whole_gpus_and_cpu_only_runs_validly() -> None:
    nodes = [node("a", 2, cpu=8000), node("b", 4, cpu=8000, model="P100")]
    pods = [
        pod("w", 2, spec="P100"),
        pod("f", 1, 250),
        pod("f2", 1, 750),
        pod("c", 0, cpu=6000),
        pod("big", 4),
    ]
    c = Cluster(nodes)
    place = CorePlacer(nodes)
    rng = random.Random(1)
    got = []
    for p in pods:
        choice = place(c, p, rng)
        if choice is not None:
            c.book(choice, p)  # asserts the placement fits
        got.append(None if choice is None else c.nodes[choice[0]].name)
    assert got[0] == "b" and got[4] is None  # 'big' needs 4 whole GPUs: b holds 2 already
    assert got[1] == got[2]  # the two shares fill one device rather than split two
    assert sum(1 for g in got if g is not None) == 4


def _openb_sample(nodes: int, pods: int) -> tuple[list[Node], list[Pod]]:
    """Every k-th node of the vendored cluster (its GPU models and host sizes mixed) and the
    first pods of the GPU-model-restricted file (shares, whole GPUs, CPU-only pods)."""
    every = load_nodes()
    return every[:: len(every) // nodes][:nodes], list(
        load_pods(POD_FILES["gpuspec33"]).pods[:pods]
    )


def test_the_core_places_alike_on_the_native_and_the_reference_engine(
    native_module: object,
) -> None:
    """Pod by pod on one cluster, both engines make the same choice (node, devices) or both
    fail the pod, with the file's shape prior (``file_shapes``) weighing the placements; a
    difference names the pod."""
    nodes, pods = _openb_sample(40, 600)
    prior = file_shapes(pods)
    py, nat = CorePlacer(nodes, prior, "reference"), CorePlacer(nodes, prior, "native")
    assert (py.engine_name, nat.engine_name) == ("reference", "native")
    c, rng = Cluster(nodes), random.Random(1)
    placed = failed = 0
    for i, p in enumerate(pods):
        want, got = py(c, p, rng), nat(c, p, rng)
        assert got == want, f"pod {i} ({p.name}): reference {want}, native {got}"
        if want is None:
            failed += 1
        else:
            c.book(want, p)
            placed += 1
    assert placed > 100 and failed > 0  # the cluster filled up: the choices got hard


def test_replay_rows_are_the_same_on_either_engine(native_module: object) -> None:
    nodes, pods = _openb_sample(12, 200)
    rows = {e: replay("sample", nodes, pods, "default", engine=e).row() for e in ENGINES}
    assert [rows[e].pop("engine") for e in ENGINES] == ["native", "reference", "native"]
    for r in rows.values():
        r.pop("wall_s")
    assert rows["reference"] == rows["native"] == rows["auto"]
    assert "engine" not in replay("sample", nodes, pods, "first-fit").row()


def test_without_the_native_engine_the_reference_engine_packs(without_native: None) -> None:
    nodes, pods = _openb_sample(4, 40)
    assert replay("sample", nodes, pods, "default").engine == "reference"  # auto falls back
    with pytest.raises(NotSupported, match="openb packing: the Rust engine"):
        CorePlacer(nodes, file_shapes(pods), "native")
    with pytest.raises(ValueError, match="engine: expected one of auto, reference, native"):
        CorePlacer(nodes, None, "rust")
