"""Active runs loaded from the store that name what the cluster no longer has (a node removed or
renamed, a GPU type, backend or project gone from the config, a device named twice or one
its node lacks, host resources that are not the request's, a device another loaded run holds
too): both engines book them as ``core.held.as_held`` says and then decide alike, cycle by
cycle, as a from-scratch ``decide`` does (``test_native_core.replay``). The native engine
refused most of these once (``native_support.held_unsupported``, gone), and the control loop
then ran the whole cluster on the Python engine.

On the Rust side, ``Placement::amount`` ignoring ``charged`` (a loaded run charged by its
slots on the cluster alone) was checked to fail the gone-type and gone-part cases here; in
Python, charging a gone part by its device count fails ``part_on_a_gone_node``. A device (or
slice) two loaded runs hold stays held until both end: giving it back with the first run's end
on either side alone (``Capacity._free_devices`` in Python, ``free_devices`` in Rust) was
checked to fail ``test_a_device_two_runs_hold_stays_held_until_both_end``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_native_core import replay

from mlops_gpu.core.held import as_held
from mlops_gpu.core.state import State
from mlops_gpu.engines.native import NativeEngine
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import Phase, Placement, Quota, Run
from mlops_gpu.model.cluster import NodeSlot
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot

A, H = "a100-80gb", "h100-80gb"


@pytest.fixture(scope="module")
def native(native_module: Any) -> Any:
    return native_module


def _template(**policy: Any) -> Any:
    nodes = [
        make_node("n0", 4, A, backend="b1", cpu_milli=16000, host_memory_mb=64000),
        make_node("n1", 4, A, backend="b1", cpu_milli=16000, host_memory_mb=64000),
        make_node("s0", 2, A, backend="b1", shared=True, gpu_memory_mb=80000),
        make_node("m0", 1, H, backend="b2", mig={"1g.10gb": ("s0", "s1", "s2")}),
    ]
    quotas = {A: Quota(6, 4), H: Quota(2, 1)}
    projects = [
        make_project("p0", quotas=quotas, cohort="c"),
        make_project("p1", quotas=quotas, cohort="c"),
    ]
    return make_snapshot(nodes, projects, now=0.0, **policy)


def _held(rid: str, project: str, gpu_type: str, *slots: NodeSlot, **kw: Any) -> Run:
    backend = kw.pop("backend", "b1")
    gpus = sum(len(s.devices) for s in slots)
    return make_run(
        rid,
        project,
        max(gpus, 1),
        len(slots),
        phase=Phase.RUNNING,
        placement=Placement(backend, gpu_type, tuple(slots)),
        preemptible=True,
        max_runtime_s=kw.pop("max_runtime_s", 30.0),
        admitted_at=0.0,
        **kw,
    )


def _slot(node: str, *devices: str, **kw: Any) -> NodeSlot:
    return NodeSlot(node, tuple(devices), **kw)


#: Each former refusal, as an active run loaded from the store.
CASES: dict[str, tuple[Run, ...]] = {
    "whole_gpus_on_a_gone_node": (_held("h", "p0", A, _slot("gone", "0", "1")),),
    "a_gang_half_on_a_gone_node": (_held("h", "p0", A, _slot("n0", "0", "1"), _slot("gone", "0")),),
    "a_backend_the_cluster_lacks": (_held("h", "p0", A, _slot("n0", "0", "1"), backend="old"),),
    "a_type_the_cluster_lacks_on_a_gone_node": (_held("h", "p1", "v100", _slot("gone", "0")),),
    "a_type_the_cluster_lacks_on_a_renamed_node": (
        _held("h", "p1", "v100", _slot("n1", "0", "1", "2")),
    ),
    "an_unknown_project": (_held("h", "gone", A, _slot("n0", "0", "1", "2")),),
    "an_unknown_project_and_type": (_held("h", "gone", "v100", _slot("n1", "3")),),
    "a_device_held_twice": (_held("h", "p0", A, _slot("n0", "1", "1", "2")),),
    "devices_the_node_lacks": (_held("h", "p0", A, _slot("n0", "2", "9", "x")),),
    "a_slice_the_node_lacks": (
        _held("h", "p1", H, _slot("m0", "s1", "s7", fraction=1 / 7), mig="1g.10gb"),
    ),
    "part_on_a_gone_node": (
        _held("h", "p1", A, _slot("gone", "0", fraction=0.5), gpu_fraction=0.5),
        _held("k", "p1", A, _slot("s0", "1", fraction=0.5), gpu_fraction=0.5),
    ),
    "host_resources_not_the_requests": (
        _held("h", "p0", A, _slot("n0", "0", cpu_milli=12000, host_memory_mb=8000)),
    ),
    "host_resources_that_differ_per_slot": (
        _held(
            "h",
            "p0",
            A,
            _slot("n0", "0", cpu_milli=9000, host_memory_mb=100),
            _slot("n1", "0", cpu_milli=2000, host_memory_mb=50000),
            cpu_milli=2000,
        ),
    ),
    "a_device_held_by_two_runs": (
        _held("h", "p0", A, _slot("n0", "0", "1")),
        _held("k", "p0", A, _slot("n0", "1", "2"), max_runtime_s=60.0),
    ),
    "a_run_being_preempted_on_a_gone_node": (
        replace(_held("h", "p0", A, _slot("gone", "0")), preempt_requested=True),
    ),
}


def _events() -> list[tuple[Any, ...]]:
    """Runs of both projects that need what the loaded runs hold (whole GPUs, host CPU, parts,
    MIG slices, high-priority preemptors), cycles between, and runs finishing."""
    subs = [
        make_run("w4", "p0", 4, seq=10, max_runtime_s=50.0),
        make_run("w3", "p1", 3, seq=11, max_runtime_s=20.0, cpu_milli=4000),
        make_run("c", "p1", 0, seq=12, cpu_milli=8000),
        make_run("f", "p0", 1, seq=13, gpu_fraction=0.5),
        make_run("m", "p1", 1, seq=14, mig="1g.10gb", gpu_types=(H,)),
        make_run("g", "p0", 2, 2, seq=15, max_runtime_s=40.0),
        make_run("x", "p1", 4, seq=16, priority="high"),
        make_run("y", "p0", 8, seq=17, preemptible=True),
        make_run("z", "p1", 1, seq=18, gpu_types=(H,), priority="high"),
    ]
    ev: list[tuple[Any, ...]] = []
    for i, r in enumerate(subs):
        ev.append(("submit", r))
        if i % 2:
            ev.append(("cycle", None))
    ev += [
        ("cycle", None),
        ("finish", 0, True),
        ("cycle", {("p0", A): 5000.0}),
        ("finish", 3, False),
    ]
    ev += [("cycle", None), ("finish", 1, False), ("finish", 0, True), ("cycle", None)]
    return ev


@pytest.mark.parametrize("placement", ["fragmentation", "best-fit"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_holding_what_the_cluster_lacks_is_booked_alike(
    native: Any, case: str, placement: str
) -> None:
    template = _template(placement=placement)
    loaded = CASES[case]
    busy = replay(native, template, _events(), loaded=loaded)
    assert busy  # (the loaded runs were competed for: something was admitted)


def test_what_a_loaded_run_holds_is_the_same_on_both_engines(native: Any) -> None:
    """Quota held, per (project, type), after loading every case at once (distinct ids)."""
    template = _template()
    ref, nat = FromScratch(template), NativeEngine(template, native)
    for name, runs in sorted(CASES.items()):
        for r in runs:
            run = replace(r, id=f"{name}.{r.id}")
            ref.add_active(run)
            nat.add_active(run)
    assert nat.used == {k: ref.used.get(k, 0.0) for k in nat.used}
    assert nat.used[("p1", A)] == 0.5 + 0.5  # (a part on a gone node counts)
    assert nat.active == ref.active
    # a device the node lacks, or named twice, holds nothing more; the slots' host agrees
    got = ref.active["devices_the_node_lacks.h"].placement
    assert got is not None and got.slots[0].devices == ("2",)
    got = ref.active["host_resources_that_differ_per_slot.h"].placement
    assert got is not None and {(s.cpu_milli, s.host_memory_mb) for s in got.slots} == {
        (9000, 50000)
    }
    for rid in sorted(ref.active):
        assert nat.finish(rid) == ref.finish(rid)
    assert nat.used == {k: 0.0 for k in nat.used}


def test_as_held_keeps_a_cycles_placement_and_refuses_none(native: Any) -> None:
    template = _template()
    nodes = {n.name: n for n in template.nodes}
    ok = _held("h", "p0", A, _slot("n0", "0", "1"))
    assert as_held(ok, nodes) is ok
    twice = as_held(CASES["a_device_held_twice"][0], nodes)
    assert as_held(twice, nodes) is twice
    with pytest.raises(ValueError, match="run r is active without a placement"):
        as_held(make_run("r", "p0", phase=Phase.RUNNING), nodes)
    with pytest.raises(ValueError, match="without a placement"):
        NativeEngine(template, native).add_active(make_run("r", "p0", phase=Phase.RUNNING))


def test_a_run_on_a_type_the_cluster_lacks_holds_no_quota_anyone_waits_for(native: Any) -> None:
    """Its project at its quota on a type the cluster has: the run on a gone type is not
    among the holders a waiting run's reason and ETA read (``State.held`` files it under its
    own type), on either engine."""
    nodes = [make_node("n0", 4, A, backend="b1")]
    template = make_snapshot(nodes, [make_project("p1", quotas={A: Quota(2, 0)})], now=0.0)
    loaded = (
        _held("g", "p1", "v100", _slot("gone", "0"), max_runtime_s=5.0),
        _held("u", "p1", "v100", _slot("gone", "1"), max_runtime_s=None),
        _held("h", "p1", A, _slot("n0", "0", "1"), max_runtime_s=50.0),
    )
    events: list[tuple[Any, ...]] = [
        ("submit", make_run("w", "p1", 1, seq=5, max_runtime_s=10.0)),
        ("cycle", None),
        ("submit", make_run("v", "p1", 2, seq=6)),
        ("cycle", None),
    ]
    replay(native, template, events, loaded=loaded)


@pytest.mark.parametrize("placement", ["fragmentation", "best-fit"])
@pytest.mark.parametrize("held", ["whole", "slice"])
def test_a_device_two_runs_hold_stays_held_until_both_end(
    native: Any, held: str, placement: str
) -> None:
    """Two runs loaded from the store hold one device (``n0:0,1`` and ``n0:1,2``), or one MIG
    slice: when the first ends, the device stays held by the other, so the 4-GPU run (or the
    slice's run) still waits, with the same reason and ETA as ``decide`` gives (before, both
    incremental engines freed the device at the first end: a free block of 2, ETA 9 s, where
    ``decide`` said 1, ETA 60 s)."""
    nodes = [
        make_node("n0", 4, A, backend="b1"),
        make_node("n1", 2, A, backend="b1"),
        make_node("m0", 1, H, backend="b2", mig={"1g.10gb": ("s0", "s1")}),
    ]
    quotas = {A: Quota(8, 4), H: Quota(2, 1)}
    projects = [make_project("p0", quotas=quotas), make_project("p1", quotas=quotas)]
    template = make_snapshot(nodes, projects, now=0.0, placement=placement)
    if held == "whole":
        loaded = (
            _held("h", "p0", A, _slot("n0", "0", "1"), max_runtime_s=30.0),
            _held("k", "p1", A, _slot("n0", "1", "2"), max_runtime_s=60.0),
        )
        wants = [make_run("w4", "p0", 4, seq=1, max_runtime_s=10.0), make_run("w2", "p1", 2, seq=2)]
    else:
        kw: dict[str, Any] = {"fraction": 1 / 7}
        loaded = (
            _held("h", "p0", H, _slot("m0", "s0", "s1", **kw), mig="1g.10gb", max_runtime_s=30.0),
            _held("k", "p1", H, _slot("m0", "s1", **kw), mig="1g.10gb", max_runtime_s=60.0),
        )
        wants = [make_run("w", "p0", 2, seq=1, mig="1g.10gb", gpu_types=(H,))]
    events: list[tuple[Any, ...]] = [("submit", r) for r in wants]
    events += [("cycle", None), ("finish", 0, False), ("cycle", None), ("cycle", None)]
    replay(native, template, events, loaded=loaded)
    # the reference's own books, released run by run as a cycle releases its victims' holdings
    ref = FromScratch(template)
    for r in loaded:
        ref.add_active(r)
    cap = State(ref.snapshot(0.0)).cap
    for rid, want in (("h", (["0", "3"], ["s0"])), ("k", (["0", "1", "2", "3"], ["s0", "s1"]))):
        run = ref.active[rid]
        assert run.placement is not None
        cap.release(run.project, run.placement, run.request.gpu_types)
        free = cap.free["n0"] if held == "whole" else cap.mig_free["m0"]["1g.10gb"]
        assert free == (want[0] if held == "whole" else want[1])
