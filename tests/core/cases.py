"""Shared vocabulary for the table-driven policy tests. ``check`` runs a case on the Python
reference (``decide``) and, where the extension is built (required in CI:
``MLOPS_GPU_REQUIRE_NATIVE``), on the Rust engine too (``on_native_too``): the same
admissions, placements, preemptions, reason codes, sentences and ETAs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from types import ModuleType

from mlops_gpu.core import Decision, ReasonCode, Snapshot, decide
from mlops_gpu.engines import native
from mlops_gpu.engines.native import NativeEngine
from mlops_gpu.model import Phase, Quota
from mlops_gpu.testing import make_node, make_project, make_run
from mlops_gpu.testing.builders import placed, placed_gang

A100, H100 = "a100-80gb", "h100-80gb"
R = Phase.RUNNING


@dataclass
class Case:
    snap: Snapshot
    #: run id -> node name, or a tuple of node names for a gang
    admit: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    preempt: set[str] = field(default_factory=set)
    codes: dict[str, ReasonCode] = field(default_factory=dict)
    says: dict[str, str] = field(default_factory=dict)
    eta: dict[str, float | None] = field(default_factory=dict)
    #: run id -> devices it must get (on its single node)
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)


def check(case: Case) -> Decision:
    d = decide(case.snap)
    got = {
        a.run_id: (
            a.placement.node_names[0] if len(a.placement.slots) == 1 else a.placement.node_names
        )
        for a in d.admissions
    }
    assert got == case.admit, f"admitted {got}; pending {[(p.run_id, p.reason) for p in d.pending]}"
    assert {p.run_id for p in d.preemptions} == case.preempt, d.preemptions
    reasons = {p.run_id: p for p in d.pending}
    for rid, code in case.codes.items():
        assert rid in reasons, f"{rid} not pending"
        assert reasons[rid].reason_code is code, reasons[rid]
    for rid, text in case.says.items():
        assert text in reasons[rid].reason, reasons[rid].reason
    for rid, eta in case.eta.items():
        assert reasons[rid].eta == eta, reasons[rid]
    for rid, devs in case.devices.items():
        (adm,) = [a for a in d.admissions if a.run_id == rid]
        assert adm.placement.slots[0].devices == devs
    assert decide(case.snap) == d  # same snapshot, same decision
    on_native_too(case.snap)
    return d


def on_native_too(snap: Snapshot) -> None:
    """``native_decides`` on ``snap`` where the extension is built; where it is not, nothing,
    unless ``MLOPS_GPU_REQUIRE_NATIVE`` is set (CI), as for the ``native_module`` fixture."""
    module = native.installed()
    if module is not None:
        native_decides(module, snap)
    elif os.environ.get("MLOPS_GPU_REQUIRE_NATIVE"):
        raise AssertionError("mlops_gpu._engine is not built (no cargo at `pip install -e .`)")


def native_decides(native: ModuleType, snap: Snapshot) -> Decision:
    """``decide(snap)``, after checking that the native engine, loaded with the snapshot's
    active and pending runs, explains every pending run alike (codes, sentences, ETAs; before
    the cycle) and admits, places and preempts the same."""
    nat = NativeEngine(replace(snap, pending=(), active=()), native)
    for a in snap.active:
        nat.add_active(a)
    for p in snap.pending:
        nat.submit(p)
    want = decide(snap)
    explained = nat.explain_all(snap.now)
    assert {p.run_id: p for p in explained} == {p.run_id: p for p in want.pending}
    got = nat.cycle(snap.now)
    assert got.admissions == want.admissions
    assert got.preemptions == want.preemptions
    return want


def busy(
    run_id: str, project: str, node: str, devices: list[str], *, gpu_type: str = A100, **kw: object
) -> object:
    """An active run holding ``devices`` on ``node``."""
    return make_run(
        run_id, project, gpus=len(devices), phase=R, placement=placed(node, devices, gpu_type), **kw
    )  # type: ignore[arg-type]


__all__ = [
    "A100",
    "H100",
    "Case",
    "Quota",
    "busy",
    "check",
    "make_node",
    "make_project",
    "make_run",
    "placed",
    "placed_gang",
]
