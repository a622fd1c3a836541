"""Elastic pools on Kubernetes without a cluster: the pool's nodes and slots as the scale
decision sees them (``k8s_capacity.pool_nodes``), the placeholder pod (golden file
``k8s/golden/placeholder.json``; ``MLOPS_GPU_UPDATE_GOLDEN=1`` rewrites it), and
``PoolControl`` asking for slots and settling them through a backend's ``capacity``. The real
control plane with Karpenter is in ``tests/k8s/test_k8s_autoscale.py``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlops_gpu.backends.k8s_capacity import (
    POOL_LABEL,
    RELEASING,
    Placeholder,
    parse_placeholder,
    parse_slot,
    placeholder_manifest,
    pool_nodes,
)
from mlops_gpu.backends.k8s_capacity import (
    Placeholders as RealPlaceholders,
)
from mlops_gpu.config.pools import not_acted_on
from mlops_gpu.controller import Runtime
from mlops_gpu.controller.pools import Capacity, PoolControl
from mlops_gpu.core.decision import PendingReason, ReasonCode
from mlops_gpu.model import BackendCapabilities, Node, Pool, PoolNode, Run
from mlops_gpu.testing import config_yaml, make_node, make_run

NOW = 1000.0
POOL = Pool("gpu", "k8s", "a100-80gb", 8, 0, 3, 30.0, 10.0, 60.0)
GOLDEN = Path(__file__).parent / "k8s" / "golden" / "placeholder.json"


def node(name: str, *, pool: str = "gpu", ok: bool = True, why: str = "") -> Node:
    labels = {POOL_LABEL: pool} if pool else {}
    return make_node(name, 8, "a100-80gb", "k8s", schedulable=ok, state_reason=why,
                     labels=labels)  # fmt: skip


def ph(slot: int, node: str | None = None, asked: float = NOW - 10) -> Placeholder:
    return Placeholder(f"p{slot}", "gpu", slot, asked, node, ("r1",))


def states(got: list[PoolNode]) -> list[tuple[str, str, float | None]]:
    return [(n.name, n.state.value, n.ready_at) for n in got]


@pytest.mark.parametrize(
    ("nodes", "held", "want"),
    [
        ((), (), [("gpu/new-0", "powered_down", None), ("gpu/new-1", "powered_down", None),
                  ("gpu/new-2", "powered_down", None)]),
        ((), (ph(1),), [("gpu/new-1", "booting", NOW + 20), ("gpu/new-0", "powered_down", None),
                        ("gpu/new-2", "powered_down", None)]),
        ((node("n1"),), (ph(0, "n1"),), [("n1", "up", None), ("gpu/new-1", "powered_down", None),
                                          ("gpu/new-2", "powered_down", None)]),
        ((node("n1", ok=False, why="registering"),), (ph(0, "n1"),),
         [("n1", "booting", NOW), ("gpu/new-1", "powered_down", None),
          ("gpu/new-2", "powered_down", None)]),
        ((node("n1"), node("n2", ok=False, why="being removed by the autoscaler"),
          node("other", pool="cpu"), node("bare", pool="")), (),
         [("n1", "up", None), ("gpu/new-0", "powered_down", None),
          ("gpu/new-1", "powered_down", None)]),
        ((node("n1"), node("n2"), node("n3"), node("n4")), (),
         [("n1", "up", None), ("n2", "up", None), ("n3", "up", None), ("n4", "up", None)]),
    ],
    ids=["empty", "asked", "bound-up", "bound-registering", "others-ignored", "over-max"],
)  # fmt: skip
def test_pool_nodes(
    nodes: tuple[Node, ...], held: tuple[Placeholder, ...], want: list[tuple[str, str, float]]
) -> None:
    assert states(pool_nodes(POOL, nodes, held, NOW)) == want


def test_slot_names_parse() -> None:
    assert parse_slot("gpu/new-3") == ("gpu", 3)
    assert parse_slot("kwok-gpu-abc") is None


def test_placeholder_manifest_matches_golden_and_parses_back() -> None:
    pod = placeholder_manifest(POOL, 2, ["r1", "r2"], 1234.5, "ml", priority=True)
    text = json.dumps(pod, indent=2, sort_keys=True) + "\n"
    if os.environ.get("MLOPS_GPU_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    got = parse_placeholder(pod)
    assert got == Placeholder(pod["metadata"]["name"], "gpu", 2, 1234.5, None, ("r1", "r2"))
    bare = placeholder_manifest(POOL, 0, [], NOW, "ml", priority=False)
    assert "priorityClassName" not in bare["spec"]
    bare["metadata"]["deletionTimestamp"] = "2026-12-03T07:00:00Z"
    assert parse_placeholder(bare) is None  # being deleted: no longer asks for anything


class Placeholders:
    """A backend ``capacity`` kept in memory (what ``k8s_capacity.Placeholders`` keeps in the
    cluster), with the same node and slot rules (``pool_nodes``)."""

    def __init__(self) -> None:
        self.held: list[Placeholder] = []
        self.deleted: list[str] = []
        self.leaving: set[str] = set()  # nodes of the last settle's deletions (unconfirmed)

    def pool_nodes(self, pool: Pool, nodes: Sequence[Node], now: float) -> list[PoolNode]:
        return pool_nodes(pool, nodes, self.held, now)

    def settle(self, pool: Pool, nodes: Sequence[Node], now: float) -> None:
        up = {n.name for n in nodes if n.schedulable}
        self.leaving = {p.node for p in self.held if p.node in up}  # (the last ones confirmed)
        self.deleted += [p.name for p in self.held if p.node in up]
        self.held = [p for p in self.held if p.node not in up]

    def releasing(self) -> set[str]:
        return self.leaving | {p.node for p in self.held if p.node is not None}

    def forget_others(self, pools: Iterable[Pool]) -> bool:
        names = {p.name for p in pools}
        self.deleted += [p.name for p in self.held if p.pool not in names]
        self.held = [p for p in self.held if p.pool in names]
        return True

    def ask(self, pool: Pool, slots: Mapping[str, Sequence[str]], now: float) -> None:
        for name, runs in sorted(slots.items()):
            parsed = parse_slot(name)
            assert parsed is not None
            self.held.append(Placeholder(f"p{parsed[1]}", "gpu", parsed[1], now, None,
                                         tuple(runs)))  # fmt: skip


class K8sBackend:
    capabilities = BackendCapabilities(multi_node=True)  # (the Kubernetes backend's: gangs)

    def __init__(self) -> None:
        self.capacity = Placeholders()


def runtime(tmp_path: Path) -> Runtime:
    data = yaml.safe_load(config_yaml(projects={"p": (64, 0)}))
    data["gpu_types"] = {"a100-80gb": {"price_per_hour": 2.5}}
    data["backends"] = {"k8s": {"type": "kubernetes", "kubeconfig": "/nonexistent"}}
    data["projects"]["p"]["quotas"] = {"a100-80gb": {"nominal": 64, "borrowing_limit": 0}}
    data["pools"] = {"gpu": {"backend": "k8s", "gpu_type": "a100-80gb", "gpus_per_node": 8,
                             "max_nodes": 3, "boot_s": 30, "price_per_node_hour": 10}}  # fmt: skip
    path = tmp_path / "mlops-gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    rt = Runtime.load(path)
    rt.__dict__["backends"] = {"k8s": K8sBackend()}  # (``Runtime.backends`` is cached)
    return rt


def waiting(runs: list[Run]) -> list[PendingReason]:
    return [PendingReason(r.id, ReasonCode.NO_CAPACITY, "waiting for GPUs", None) for r in runs]


def test_a_burst_asks_for_placeholders_and_they_go_once_the_nodes_are_up(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    assert not_acted_on(rt.cfg.pools, rt.cfg.backends) is None  # Kubernetes pools are acted on
    cap = rt.backends["k8s"].capacity
    assert isinstance(cap, Capacity)
    pc = PoolControl(rt)
    runs = [make_run(f"r{i}", gpus=4, gpu_types=["a100-80gb"]) for i in range(5)]
    by_id = {r.id: r for r in runs}
    assert pc.open((), NOW) == ()  # no node at all: nothing to offer
    out = pc.explain(NOW, waiting(runs), by_id, [], ())
    # 5 runs of 4 GPUs: 3 nodes of 8 (the last one half used), each asked for by a placeholder
    assert [(p.slot, p.runs) for p in cap.held] == [(0, ("r0", "r1")), (1, ("r2", "r3")),
                                                     (2, ("r4",))]  # fmt: skip
    assert pc.opened == {}  # nothing is offered to the core: the nodes do not exist yet
    assert out[0].reason == "waiting for node gpu/new-0 to boot (ETA 1 min)"
    assert out[0].eta == NOW + 30
    # the next tick: still booting, nothing more asked; the wait counts from the ask
    out = pc.explain(NOW + 10, waiting(runs), by_id, [], ())
    assert len(cap.held) == 3 and out[4].eta == NOW + 30
    # Karpenter's node for slot 0 is up and kube-scheduler bound the placeholder there
    cap.held[0] = Placeholder("p0", "gpu", 0, NOW, "kwok-gpu-a", ("r0", "r1"))
    nodes = (node("kwok-gpu-a"),)
    # its placeholder is deleted, but the node is not offered until that is confirmed (a
    # kubelet still counting the placeholder's GPUs would refuse a run pinned there)
    held = pc.open(nodes, NOW + 20)
    assert cap.deleted == ["p0"] and [p.slot for p in cap.held] == [1, 2]
    assert [(n.schedulable, n.state_reason) for n in held] == [(False, RELEASING)]
    out = pc.explain(NOW + 20, waiting(runs), by_id, [], held)
    # the node counts as booting (ready now): no new slot is asked in its place
    assert len(cap.held) == 2 and {r.reason.split(" to boot")[0] for r in out} == {
        "waiting for node kwok-gpu-a",
        "waiting for node gpu/new-1",
        "waiting for node gpu/new-2",
    }
    assert pc.open(nodes, NOW + 21) == nodes  # gone: the core places r0, r1 there itself
    out = pc.explain(NOW + 21, waiting(runs[2:]), by_id, [], nodes)
    assert len(cap.held) == 2 and out[0].reason.startswith("waiting for node gpu/new-1 to boot")


def test_at_max_nodes_a_kubernetes_pool_asks_for_no_more(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    cap = rt.backends["k8s"].capacity
    pc = PoolControl(rt)
    nodes = tuple(node(f"n{i}") for i in range(3))
    runs = [make_run("big", gpus=8, gpu_types=["a100-80gb"])]
    out = pc.explain(NOW, waiting(runs), {"big": runs[0]}, [], nodes)
    assert cap.held == []
    assert out[0].reason == "waiting for capacity: pool gpu is at max_nodes (3)"


class Api:
    """The three calls ``k8s_capacity.Placeholders`` makes, on pods kept in a list (the real
    API server is in ``tests/k8s/test_k8s_autoscale.py``)."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.list_namespaced_pod = self.delete_namespaced_pod = self.create_namespaced_pod = (
            object()
        )

    def clients(self) -> tuple[Any, None, None]:
        return self, None, None

    def get(self, what: str, fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        return {"items": list(self.pods)}

    def send(self, what: str, fn: Any, *args: Any, **kw: Any) -> None:
        if fn is self.delete_namespaced_pod:
            self.pods = [p for p in self.pods if p["metadata"]["name"] != args[0]]
        else:
            self.pods.append(args[1])


def bound(slot: int, at: float, node: str | None) -> dict[str, Any]:
    pod = placeholder_manifest(POOL, slot, ["r"], at, "ml", priority=False)
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def test_settle_deletes_placeholders_whose_node_is_up_or_never_came() -> None:
    api = Api([bound(0, NOW, "n1"), bound(1, NOW + 1, None), bound(2, NOW - 200, None)])
    cap = RealPlaceholders(api.clients, api.get, api.send, "ml")
    cap.settle(POOL, (node("n1"),), NOW + 5)
    # n1 is up: its placeholder goes; slot 2 waited past boot_s + the grace; slot 1 waits on
    assert [p["metadata"]["labels"]["mlops-gpu/slot"] for p in api.pods] == ["1"]
    # n2 comes up with no placeholder bound yet: it takes the pending one's place (else the
    # core fills n2 and the placeholder, finding no room, would have Karpenter add a node)
    cap.settle(POOL, (node("n1"), node("n2")), NOW + 6)
    assert api.pods == []
    assert [n.state.value for n in cap.pool_nodes(POOL, (node("n1"), node("n2")), NOW)] == [
        "up", "up", "powered_down"]  # fmt: skip


def test_a_node_is_released_to_the_core_only_once_its_placeholder_is_gone() -> None:
    # the API server lists the deleted placeholder once more, terminating (a real kubelet
    # still holds its GPUs meanwhile)
    api = Api([bound(0, NOW, "n1"), bound(1, NOW, None)])
    cap = RealPlaceholders(api.clients, api.get, api.send, "ml")
    assert cap.releasing() == set()
    cap.held(refresh=True)
    assert cap.releasing() == {"n1"}  # bound there: its GPUs are the placeholder's
    cap.settle(POOL, (node("n1"),), NOW + 5)
    assert [p["metadata"]["labels"]["mlops-gpu/slot"] for p in api.pods] == ["1"]
    assert cap.releasing() == {"n1"}  # deleted, not yet confirmed by a list
    leaving = bound(0, NOW, "n1")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-03T07:00:00Z"
    api.pods.append(leaving)
    cap.settle(POOL, (node("n1"),), NOW + 6)
    assert cap.releasing() == {"n1"}  # listed, terminating
    api.pods.remove(leaving)
    cap.settle(POOL, (node("n1"),), NOW + 7)
    assert cap.releasing() == set()  # gone: n1's GPUs are free
    assert [n.state.value for n in cap.pool_nodes(POOL, (node("n1"),), NOW)][:2] == [
        "up", "booting"]  # fmt: skip
    held = node("n1", ok=False, why=RELEASING)
    assert [n.state.value for n in cap.pool_nodes(POOL, (held,), NOW)][:2] == [
        "booting", "booting"]  # fmt: skip


def test_a_placeholder_bound_to_a_node_that_never_comes_up_goes_after_the_grace() -> None:
    # bound by kube-scheduler to n1, which stays NotReady (or cordoned): kept, it would hold
    # n1 up for good (consolidation never removes a node with a pod on it)
    api = Api([bound(0, NOW, "n1")])
    cap = RealPlaceholders(api.clients, api.get, api.send, "ml")
    stuck = (node("n1", ok=False, why="NotReady"),)
    cap.settle(POOL, stuck, NOW + POOL.boot_s)  # within boot_s + the grace: it waits
    assert len(api.pods) == 1
    cap.settle(POOL, stuck, NOW + POOL.boot_s + 61)
    assert api.pods == []


def test_placeholders_of_a_pool_no_longer_in_the_config_are_deleted(tmp_path: Path) -> None:
    other = Pool("old", "k8s", "a100-80gb", 8, 0, 3, 30.0, 10.0, 60.0)
    api = Api([bound(0, NOW, None), placeholder_manifest(other, 0, ["r"], NOW, "ml", False)])
    cap = RealPlaceholders(api.clients, api.get, api.send, "ml")
    assert cap.forget_others([POOL]) is True
    assert [p["metadata"]["labels"][POOL_LABEL] for p in api.pods] == ["gpu"]
    # through PoolControl: once on the first tick, and again when the config's pools change
    rt = runtime(tmp_path)
    fake = rt.backends["k8s"].capacity
    fake.held = [ph(0), Placeholder("q0", "old", 0, NOW, None, ("r",))]
    pc = PoolControl(rt)
    pc.open((), NOW)
    assert fake.deleted == ["q0"] and [p.name for p in fake.held] == ["p0"]
    fake.held.append(Placeholder("q1", "old", 1, NOW, None, ("r",)))
    pc.open((), NOW + 1)  # the same pools: no sweep (no list per tick)
    assert fake.deleted == ["q0"]


def test_a_failing_sweep_backs_off_and_is_logged_once_per_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime(tmp_path)
    fake = rt.backends["k8s"].capacity
    tries: list[float] = []
    down = [True]

    def forget_others(pools: Iterable[Pool]) -> bool:
        tries.append(t)
        if down[0]:
            raise RuntimeError("list placeholder pods: HTTP 0: connection refused")
        return True

    fake.forget_others = forget_others
    pc = PoolControl(rt)
    caplog.set_level("INFO", logger="mlops_gpu.controller")
    for t in range(0, 200):  # a tick a second, the API down
        pc.open((), NOW + t)
    # tried at 0, then after 1, 2, 4, ... 32, then every 60 s (not 200 times)
    assert [x - tries[0] for x in tries] == [0, 1, 3, 7, 15, 31, 63, 123, 183]
    warned = [r for r in caplog.records if "placeholders" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"
    down[0] = False
    for t in range(200, 300):
        pc.open((), NOW + t)
    assert tries[-1] == 243 and len(tries) == 10  # once more, at its time, then done
    said = [r.getMessage() for r in caplog.records if "placeholders" in r.getMessage()]
    assert len(said) == 2 and "answers again" in said[1]


def test_a_gang_is_judged_at_submit_by_what_the_pool_can_become(tmp_path: Path) -> None:
    rt = runtime(tmp_path)  # pool gpu: up to 3 nodes of 8 GPUs, none up

    def problems(nodes: int, listed: Sequence[Node] = ()) -> list[str]:
        spec = make_run("g", gpus=8, nodes=nodes, gpu_types=["a100-80gb"]).spec
        return rt.problems(replace(spec, project="p"), list(listed))

    assert problems(1) == [] and problems(3) == []  # 3 nodes the pool can add
    (why,) = problems(4)
    assert why.startswith("nodes: 4 nodes with 8 GPUs of a100-80gb requested")
    assert why.endswith("(pool gpu has at most max_nodes 3 of 8 GPUs)")
    # two of the pool's nodes up: one more can come; a node of no pool adds its own
    assert problems(3, [node("n1"), node("n2")]) == []
    assert problems(4, [node("n1"), node("n2")])
    assert problems(4, [node("n1"), node("n2"), node("bare", pool="")]) == []


def test_placeholders_are_listed_once_a_tick_whatever_the_number_of_pools() -> None:
    # (the list shares the backend's token bucket with its launches: one call a tick)
    pools = [POOL, Pool("gpu2", "k8s", "a100-80gb", 8, 0, 3, 30.0, 10.0, 60.0)]
    api = Api([bound(0, NOW, "n1"), placeholder_manifest(pools[1], 0, ["r"], NOW, "ml", False)])
    lists: list[str] = []
    get = api.get

    def counted(what: str, fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        lists.append(what)
        return get(what, fn, *args, **kw)

    cap = RealPlaceholders(api.clients, counted, api.send, "ml")
    for pool in pools:
        cap.settle(pool, (node("n1"),), NOW)
    assert lists == ["list placeholder pods"] and len(api.pods) == 1  # n1's is deleted
    assert cap.releasing() == {"n1"}  # (the deletion is confirmed by the next tick's list)
    for pool in pools:
        cap.settle(pool, (node("n1"),), NOW + 1)
    assert len(lists) == 2 and cap.releasing() == set()
