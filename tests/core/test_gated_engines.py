"""``Gated`` in front of the reference engine ``FromScratch`` (whose ``decide`` gates again, so
it shares the gate's record of ends) decides alike on random job-control workloads
(``test_job_control.workloads``) with ``forget_ended`` (the controller's setting), where
``ended_phase`` stays bounded by what pending runs name while a stand-in for the store answers
for the other ids, as the mirror's ``_resolve`` does."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings

from mlops_gpu.engines.gated import Gated
from mlops_gpu.engines.reference import FromScratch
from mlops_gpu.model import Dependency, Phase
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from tests.core.test_job_control import workloads


def _resolve(eng: Gated, run: Any, store: dict[str, Phase]) -> None:
    """What the mirror does before it submits ``run``: the phase of each dependency that is
    neither live here nor remembered, from the store (None: no such run)."""
    missing = [
        d.run_id
        for d in run.spec.dependencies
        if d.run_id not in eng.pending
        and d.run_id not in eng.active
        and d.run_id not in eng.ended_phase
    ]
    eng.ended_many((rid, store.get(rid)) for rid in missing)


def _drive(engines: list[Gated], events: list[tuple[Any, ...]]) -> list[Any]:
    """Feed the same events to each engine; return the decisions of the first, asserting
    that every other decides the same. ``ended_phase`` of a ``forget_ended`` engine never
    holds, after a cycle, an end that no pending run names."""
    store: dict[str, Phase] = {}  # every end, as the store keeps them
    lead = engines[0]
    out: list[Any] = []
    now = 0.0

    def submit(run: Any) -> None:
        for eng in engines:
            if eng.forget_ended:
                _resolve(eng, run, store)
            eng.submit(run)

    def end(rid: str, phase: Phase) -> None:
        store[rid] = phase
        for eng in engines:
            eng.ended(rid, phase)

    for ev in events:
        now += 1.0
        if ev[0] == "submit":
            submit(replace(ev[1], submitted_at=now))
        elif ev[0] == "finish" and lead.active:
            rid = sorted(lead.active)[ev[1] % len(lead.active)]
            for eng in engines:
                eng.finish(rid)
            end(rid, ev[2])
        elif ev[0] == "release":
            held = sorted(r for r, run in lead.pending.items() if run.held)
            if held:
                rid = held[ev[1] % len(held)]
                run = replace(lead.pending[rid], held=False)
                for eng in engines:
                    eng.remove_pending(rid)
                submit(run)
        elif ev[0] == "cycle":
            ds = [eng.cycle(now) for eng in engines]
            for eng in engines:
                if eng.forget_ended:  # only the ends a pending run names are kept
                    named = {d.run_id for r in eng.pending.values() for d in r.spec.dependencies}
                    assert set(eng.ended_phase) <= named
            for d in ds[1:]:
                assert [(a.run_id, a.placement) for a in d.admissions] == [
                    (a.run_id, a.placement) for a in ds[0].admissions
                ]
                assert d.doomed == ds[0].doomed
            out.append(ds[0])
            for p in ds[0].doomed:  # the controller cancels them
                for eng in engines:
                    eng.remove_pending(p.run_id)
                end(p.run_id, Phase.CANCELLED)
    return out


def test_gated_from_scratch_admits_a_run_whose_dependency_succeeded() -> None:
    template = make_snapshot([make_node("n1", 8)], [make_project("p", 8)], [], [], now=0.0)
    eng = Gated(FromScratch(template))
    eng.submit(make_run("a", seq=1))
    eng.submit(make_run("b", seq=2, dependencies=(Dependency("afterok", "a"),)))
    assert [a.run_id for a in eng.cycle(1.0).admissions] == ["a"]
    eng.finish("a")
    eng.ended("a", Phase.SUCCEEDED)
    d = eng.cycle(2.0)
    assert [a.run_id for a in d.admissions] == ["b"]
    assert d.doomed == ()


def _forgetting(template: Any) -> Gated:
    eng = Gated(FromScratch(template))
    eng.forget_ended = True
    return eng


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_forgetting_ends_decides_as_keeping_them(
    scenario: tuple[Any, list[tuple[Any, ...]]],
) -> None:
    template, events = scenario
    _drive([Gated(FromScratch(template)), _forgetting(template)], events)


def test_ended_phase_stays_bounded_over_many_ended_runs() -> None:
    """2,000 runs end; one pending run waits on the last of them: one end is kept, not 2,000
    (in the reference engine behind the gate too: it reads the same record), and the waiting
    run still starts once its dependency succeeded."""
    template = make_snapshot([make_node("n1", 8)], [make_project("p", 8)], [], [], now=0.0)
    eng = _forgetting(template)
    now = 0.0
    for i in range(2000):
        now += 1.0
        eng.submit(make_run(f"r{i}", seq=2 * i))
        if i == 1999:
            eng.submit(make_run("w", seq=2 * i + 1, dependencies=(Dependency("afterok", "r1999"),)))
        assert [a.run_id for a in eng.cycle(now).admissions] == [f"r{i}"]
        eng.finish(f"r{i}")
        eng.ended(f"r{i}", Phase.SUCCEEDED)
    assert eng.ended_phase == {"r1999": Phase.SUCCEEDED}
    assert eng.inner.ended_phase is eng.ended_phase
    d = eng.cycle(now + 1)
    assert [a.run_id for a in d.admissions] == ["w"]
    assert eng.ended_phase == {}
