"""``update`` (``controller.update``, ``state.amend``): a change is validated as at submit, is
one ``updated`` event, reaches the running scheduler through the store's change feed (a raised
priority changes the next cycle's order, with either engine), never half-applies against an
admission (compare-and-set both ways), and a max runtime shortened after launch is enforced by
the controller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.controller.update import UNCHANGED, UpdateError, update_run
from mlops_gpu.model import Phase, ResourceRequest
from mlops_gpu.state import ConflictError, Store
from mlops_gpu.state.amend import amend_run
from mlops_gpu.testing import config_yaml


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def runtime(tmp_path: Path, clock: Clock, store_url: str | None = None) -> Runtime:
    """One fake node of 4 GPUs; project p holds at most 4."""
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)], projects={"p": (4, 0)}))
    data["backends"] = {"fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    if store_url is not None:
        data["store"] = store_url
    rt = Runtime(parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path))
    nodes = rt.cfg.model_nodes("fake")
    rt.__dict__["backends"] = {"fake": FakeBackend("fake", nodes, clock=clock)}
    return rt


def submit(rt: Runtime, gpus: int = 4, **kw: Any) -> str:
    env = {"FAKE_DURATION_S": "100"}
    spec = rt.spec(("train",), project="p", request=ResourceRequest(gpus=gpus), env=env, **kw)
    return rt.submit(spec).id


@pytest.fixture(params=["python", "native"])
def engine(request: pytest.FixtureRequest) -> str:
    request.getfixturevalue("without_native" if request.param == "python" else "native_module")
    return str(request.param)


def test_raised_priority_reaches_the_scheduler_and_changes_the_next_cycle(
    tmp_path: Path, engine: str
) -> None:
    clock = Clock()
    rt = runtime(tmp_path, clock)
    fake = rt.backends["fake"]
    assert isinstance(fake, FakeBackend)
    ctl = Controller(rt, clock=clock)
    hog = submit(rt, preemptible=False)
    ctl.tick()
    first, second = submit(rt), submit(rt)
    clock.now += 1
    ctl.tick()  # both wait behind the hog; the mirror holds them (through the feed)
    assert {first, second} <= set(ctl.mirror.runs)
    _run, what = update_run(rt, second, priority="high")
    assert what == "updated by user: priority normal -> high"
    ctl.tick()  # the feed brings the change: a high run cannot preempt a non-preemptible hog
    assert ctl.mirror.runs[second].spec.priority == "high"
    handle = fake.find(hog, 1)
    assert handle is not None
    fake.end(handle)
    clock.now += 1
    ctl.tick()
    phases = {rid: rt.store.get(rid).phase for rid in (first, second)}  # type: ignore[union-attr]
    # (without the update the older one, first, would have gone first)
    assert phases[first] is Phase.PENDING, phases
    assert phases[second] in (Phase.ADMITTED, Phase.STARTING, Phase.RUNNING), phases


def test_update_is_one_event_and_validated_as_at_submit(tmp_path: Path) -> None:
    rt = runtime(tmp_path, Clock())
    rid = submit(rt, gpus=1)
    with pytest.raises(UpdateError, match=r"priority: unknown priority class 'top'"):
        update_run(rt, rid, priority="top")
    with pytest.raises(UpdateError, match=r"gpu_type: unknown GPU type 'h100'"):
        update_run(rt, rid, gpu_types=("h100",))
    with pytest.raises(UpdateError, match=r"largest node has 4"):
        update_run(rt, rid, gpus=9)
    with pytest.raises(UpdateError, match=r"nothing to update"):
        update_run(rt, rid)
    with pytest.raises(UpdateError, match=r"no run with id 'r0000000000'") as e:
        update_run(rt, "r0000000000", gpus=2)
    assert e.value.status == 404
    assert [ev.kind for ev in rt.store.events(rid)] == ["submitted"]  # nothing written
    run, what = update_run(rt, rid, gpus=2, max_runtime_s=60.0, gpu_types=("a100-80gb",))
    assert (run.spec.request.gpus, run.spec.max_runtime_s) == (2, 60.0)
    assert run.spec.request.gpu_types == ("a100-80gb",)
    assert what == ("updated by user: max_runtime none -> 60s; gpus 1 -> 2; "
                    "gpu_type any -> a100-80gb")  # fmt: skip
    assert update_run(rt, rid, gpus=2) == (run, UNCHANGED)
    events = rt.store.events(rid)
    assert [ev.kind for ev in events] == ["submitted", "updated"]
    assert events[-1].reason == what and events[-1].phase_to is None


def test_a_running_run_changes_only_priority_and_a_shorter_max_runtime(tmp_path: Path) -> None:
    clock = Clock()
    rt = runtime(tmp_path, clock)
    ctl = Controller(rt, clock=clock)
    rid = submit(rt, gpus=2)
    ctl.tick()
    ctl.tick()
    assert rt.store.get(rid).phase is Phase.RUNNING  # type: ignore[union-attr]
    for kw, flag in (({"gpus": 1}, "--gpus"), ({"gpu_types": ("a100-80gb",)}, "--gpu-type")):
        with pytest.raises(UpdateError, match=f"is running: only --priority .*not {flag}") as e:
            update_run(rt, rid, **kw)
        assert e.value.status == 409
    update_run(rt, rid, priority="low")
    update_run(rt, rid, max_runtime_s=30.0)  # unlimited -> 30 s is shorter
    with pytest.raises(UpdateError, match=r"can only be shortened .*\(it is 30s\)"):
        update_run(rt, rid, max_runtime_s=60.0)
    # the fake job runs 100 s: the controller stops it at the new limit
    clock.now += 31
    ctl.tick()
    ctl.tick()
    run = rt.store.get(rid)
    assert run is not None and run.phase is Phase.FAILED, run
    assert run.reason == "stopped after exceeding max_runtime 30s"
    with pytest.raises(UpdateError, match=r"is failed; only pending or running runs"):
        update_run(rt, rid, priority="high")


def test_update_and_admission_never_half_apply(tmp_path: Path, store_url: str) -> None:
    """The race, made deterministic by ordering the two transactions both ways."""
    rt = runtime(tmp_path, Clock(), store_url)
    store: Store = rt.store
    node_slot = _placement(rt)
    # 1. the admission commits first: an update of the GPUs then refuses, nothing written
    rid = submit(rt, gpus=1)
    old = store.get(rid).spec  # type: ignore[union-attr]
    assert store.admit_many([(rid, node_slot)], decided={rid: old}) == [True]
    new = _with_gpus(old, 2)
    with pytest.raises(ConflictError, match=r"is admitted: only --priority"):
        amend_run(store, rid, old, new)
    after = store.get(rid)
    assert after is not None and after.spec == old and after.phase is Phase.ADMITTED
    assert "updated" not in [e.kind for e in store.events(rid)]
    # 2. the update commits first: the admission decided on the old spec is refused
    rid = submit(rt, gpus=1)
    old = store.get(rid).spec  # type: ignore[union-attr]
    amend_run(store, rid, old, _with_gpus(old, 2))
    assert store.admit_many([(rid, node_slot)], decided={rid: old}) == [False]
    after = store.get(rid)
    assert after is not None and after.phase is Phase.PENDING and after.placement is None
    assert after.spec.request.gpus == 2  # (the store's cache of runs sees the new spec)
    # 3. two updates from the same view: the second finds the spec changed under it
    with pytest.raises(ConflictError, match=r"was updated meanwhile"):
        amend_run(store, rid, old, _with_gpus(old, 3))
    assert store.get(rid).spec.request.gpus == 2  # type: ignore[union-attr]


def _with_gpus(spec: Any, gpus: int) -> Any:
    from dataclasses import replace

    return replace(spec, request=replace(spec.request, gpus=gpus))


def _placement(rt: Runtime) -> Any:
    from mlops_gpu.model import NodeSlot, Placement

    return Placement("fake", "a100-80gb", (NodeSlot("node-a", ("0",)),))


def test_sdk_run_update(cfg_path: Path) -> None:
    import mlops_gpu as mg

    run = mg.submit("sleep 1", project="p", gpus=1, config=cfg_path, start_scheduler=False)
    assert run.update(priority="high", max_runtime=60, gpu_type="a100-80gb") is run
    spec = run.record.spec
    assert (spec.priority, spec.max_runtime_s, spec.request.gpu_types) == (
        "high", 60, ("a100-80gb",))  # fmt: skip
    with pytest.raises(ValueError, match=r"^gpus: 9 GPUs per node"):
        run.update(gpus=9)
    assert run.cancel() == "cancelled"


def test_an_element_of_a_limited_array_changes_only_its_max_runtime(tmp_path: Path) -> None:
    """Job control passes a limited array's first pending elements on (``core.eligibility``),
    exact while they share one request and class: one element's GPUs or class do not change."""
    from mlops_gpu.controller.jobs import JobRequest, submit_job

    rt = runtime(tmp_path, Clock())
    spec = rt.spec(("train",), project="p", request=ResourceRequest(gpus=1))
    first = submit_job(rt, spec, JobRequest(array="0-2%1"))[0]
    for change in ({"gpus": 2}, {"priority": "high"}, {"gpu_types": ("a100-80gb",)}):
        with pytest.raises(UpdateError, match=r"element of array .* with a limit \(%1\)") as e:
            update_run(rt, first.id, **change)  # type: ignore[arg-type]
        assert e.value.status == 409
    run, _ = update_run(rt, first.id, max_runtime_s=60.0)
    assert run.spec.max_runtime_s == 60.0
