"""``engines.run_copy`` and the engine's ``Explanation.pending_objects``: their objects equal
what ``dataclasses.replace`` and the dataclasses' own ``__init__`` make, field for field, and
leave the originals untouched (runs with every field set away from its default, so a field the copy
missed would show)."""

from __future__ import annotations

import dataclasses
from dataclasses import fields, replace
from typing import Any

import pytest

from mlops_gpu.engines.run_copy import going, running
from mlops_gpu.model import NodeSlot, Phase, Placement, Run
from mlops_gpu.testing import make_run


def _every_field_set() -> Run:
    run = make_run("r1", "p", 2, seq=7, submitted_at=3.0, priority="high", max_runtime_s=60.0)
    return replace(
        run,
        attempt=3,
        finished_at=9.0,
        handle="h",
        exit_code=1,
        reason_code="quota",
        reason="why",
        eta=12.0,
        cancel_requested=True,
        last_checkpoint_at=4.0,
        attained_gpu_s=100.0,
        not_before=5.0,
        queued_at=6.0,
        held=True,
    )


def test_every_field_of_run_is_set_away_from_its_default() -> None:
    run = _every_field_set()
    unset = [
        f.name
        for f in fields(Run)
        if f.default is not dataclasses.MISSING
        and getattr(run, f.name) == f.default
        and f.name not in ("admitted_at", "started_at", "placement", "preempt_requested")
    ]
    assert unset == []


def test_running_is_replace() -> None:
    run = _every_field_set()
    placement = Placement("b", "a100", (NodeSlot("n1", ("0", "1")),))
    got = running(run, placement, 42.0)
    want = replace(run, phase=Phase.RUNNING, placement=placement, admitted_at=42.0, started_at=42.0)
    assert got == want and type(got) is Run
    assert run.phase is Phase.PENDING and run.placement is None  # the original is untouched


def test_going_is_replace() -> None:
    run = _every_field_set()
    got = going(run)
    assert got == replace(run, preempt_requested=True) and not run.preempt_requested


def test_a_copy_is_as_immutable_as_the_run() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        going(_every_field_set()).held = False  # type: ignore[misc]


def _same(got: object, want: object) -> None:
    """Equal, of the same class, field for field (each field's value and type), hashed alike
    and as frozen."""
    assert type(got) is type(want) and got == want
    try:
        assert hash(got) == hash(want)
    except TypeError:  # (a run holds mappings: unhashable, and its copy as well)
        with pytest.raises(TypeError):
            hash(got)
    for f in fields(want):  # type: ignore[arg-type]
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert a == b and type(a) is type(b), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, fields(want)[0].name, None)  # type: ignore[arg-type]


def test_built_objects_are_the_dataclasses_own() -> None:
    from mlops_gpu.core.decision import Admission, Decision, Preemption
    from mlops_gpu.engines.native_objects import build

    slot_args = ("n1", ("0", "1"), 0.5, 2048, 1500, 4096)
    slot = build(NodeSlot)(*slot_args)
    _same(slot, NodeSlot(*slot_args))
    placement = build(Placement)("b", "a100", (slot,))
    _same(placement, Placement("b", "a100", (NodeSlot(*slot_args),)))
    _same(build(Admission)("r1", placement), Admission("r1", placement))
    pre_args = ("v", "why", "SIGTERM", 30.0, "r1", 12.5)
    preemption = build(Preemption)(*pre_args)
    _same(preemption, Preemption(*pre_args))
    adm = (Admission("r1", placement),)
    _same(build(Decision)(adm, (preemption,), (), ()), Decision(adm, (Preemption(*pre_args),)))
    # a differing field makes them unequal (the comparison above can fail)
    assert build(NodeSlot)(*slot_args[:-1], 1) != NodeSlot(*slot_args)


def test_copier_is_replace_and_refuses_what_it_cannot_copy() -> None:
    from mlops_gpu.engines.native_objects import build, copier

    run = _every_field_set()
    got = copier(Run, ("attempt", "reason"))(run, 9, "changed")
    _same(got, replace(run, attempt=9, reason="changed"))
    with pytest.raises(TypeError, match="no field"):
        copier(Run, ("no_such_field",))

    @dataclasses.dataclass(frozen=True)
    class NotSlotted:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            pass

    for cls in (NotSlotted, Checked):
        with pytest.raises(TypeError):
            build(cls)


def test_the_engines_pending_reasons_are_the_dataclass_s(native_module: Any) -> None:
    """``Explanation.pending_objects`` (the Rust engine makes ``explain_all``'s objects):
    each equals what ``PendingReason.__init__`` makes of the same fields, with an ETA and
    without; a sentence list that does not match the runs is a ``ValueError``."""
    from mlops_gpu.core.decision import PendingReason, ReasonCode
    from mlops_gpu.engines.native import NativeEngine
    from mlops_gpu.testing import make_node, make_project, make_snapshot

    eng = NativeEngine(make_snapshot([make_node("n", 1)], [make_project("p")]), native_module)
    eng.submit(make_run("a", "p", 1, seq=1, max_runtime_s=60.0))
    eng.cycle(0.0)  # a holds the one GPU for a minute
    for i, gpus in enumerate([1, 1, 2], start=2):  # two wait for it, one never fits
        eng.submit(make_run(f"r{i}", "p", gpus, seq=i, max_runtime_s=60.0))
    got = eng.explain_native(1.0)
    codes = [ReasonCode(r.code) for r in got.reasons]
    sentences = [f"sentence {k}" for k in range(len(got.run_ids))]
    made = got.pending_objects(PendingReason, codes, sentences)
    rows = zip(got.run_ids, got.reason, sentences, got.eta, strict=True)
    want = [PendingReason(rid, codes[k], s, eta) for rid, k, s, eta in rows]
    assert sorted(p.run_id for p in made) == ["r2", "r3", "r4"]
    assert {p.eta is None for p in made} == {True, False}
    for a, b in zip(made, want, strict=True):
        _same(a, b)
    with pytest.raises(ValueError, match="sentences"):
        got.pending_objects(PendingReason, codes, sentences[:-1])
