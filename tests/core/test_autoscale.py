"""Scale decisions (``core.autoscale``): when a pool boots nodes, when it lets them go, what
budgets and ``max_nodes`` refuse, and the sentence given for each choice."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mlops_gpu.core.autoscale import Busy, Demand, ScaleInputs, decide_scale
from mlops_gpu.model import NodeState, Pool, PoolNode

UP, BOOT, DOWN, DRAIN = (
    NodeState.UP,
    NodeState.BOOTING,
    NodeState.POWERED_DOWN,
    NodeState.DRAINING,
)
NOW = 10_000.0


def pool(**kw: float) -> Pool:
    base: dict[str, float] = dict(
        gpus_per_node=8, min_nodes=0, max_nodes=4, boot_s=300, price_per_node_hour=10, idle_s=600
    )
    base.update(kw)
    return Pool(
        "p",
        "slurm",
        "a100",
        int(base["gpus_per_node"]),
        int(base["min_nodes"]),
        int(base["max_nodes"]),
        base["boot_s"],
        base["price_per_node_hour"],
        base["idle_s"],
    )


def nodes(*states: NodeState, idle: dict[int, float] | None = None) -> tuple[PoolNode, ...]:
    idle = idle or {}
    return tuple(
        PoolNode(
            f"gpu-{i}",
            "p",
            s,
            ready_at=NOW + 120 if s is BOOT else None,
            idle_since=idle.get(i),
        )
        for i, s in enumerate(states)
    )


def run(rid: str, gpus: float = 1, project: str = "nlp", n: int = 1, rt: float = 3600) -> Demand:
    return Demand(rid, project, "p", gpus, n, rt)


@dataclass
class Case:
    id: str
    states: tuple[NodeState, ...]
    pending: tuple[Demand, ...] = ()
    busy: tuple[Busy, ...] = ()
    idle: dict[int, float] = field(default_factory=dict)
    pool: Pool = field(default_factory=pool)
    budget: dict[str, float] = field(default_factory=dict)
    boot: tuple[str, ...] = ()
    down: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    undrain: tuple[str, ...] = ()
    reason: str = ""


FULL = Busy((("gpu-0", 8.0),), NOW + 7200)  # gpu-0 busy for two more hours
CASES = [
    Case("nothing-pending-nothing-to-do", (UP, DOWN), busy=(FULL,)),
    Case(
        # the core's cycle left r1 waiting beside 4 free GPUs: they are held (a reservation)
        "gpus-the-core-left-free-do-not-count",
        (UP, DOWN),
        pending=(run("r1"),),
        busy=(Busy((("gpu-0", 4.0),), NOW + 7200),),
        boot=("gpu-1",),
    ),
    Case(
        "run-waits-longer-than-a-boot-boots-one",
        (UP, DOWN, DOWN),
        pending=(run("r1"),),
        busy=(FULL,),
        boot=("gpu-1",),
        reason="booting node gpu-1 for run r1: it would start later on the current nodes",
    ),
    Case(
        "run-that-frees-before-the-boot-asks-for-nothing",
        (UP, DOWN),
        pending=(run("r1", 8),),
        busy=(Busy((("gpu-0", 8.0),), NOW + 100),),
    ),
    Case(
        "booting-node-serves-the-run",
        (UP, BOOT, DOWN),
        pending=(run("r1"),),
        busy=(FULL,),
    ),
    Case(
        "runs-packed-onto-one-new-node",
        (UP, DOWN, DOWN, DOWN),
        pending=tuple(run(f"r{i}", 2) for i in range(4)),
        busy=(FULL,),
        boot=("gpu-1",),
    ),
    Case(
        "gang-opens-two-nodes",
        (UP, DOWN, DOWN, DOWN),
        pending=(run("g", 8, n=2),),
        busy=(FULL,),
        boot=("gpu-1", "gpu-2"),
    ),
    Case(
        "max-nodes-caps-the-boot",
        (UP, UP, DOWN, DOWN),
        pending=(run("r1", 8), run("r2", 8)),
        busy=(FULL, Busy((("gpu-1", 8.0),), NOW + 7200)),
        pool=pool(max_nodes=3),
        boot=("gpu-2",),
        reason="not scaling up pool p for run r2: at max_nodes (3 up or booting)",
    ),
    Case(
        "budget-refuses-the-node",
        (UP, DOWN),
        pending=(run("r1", project="nlp", rt=3600),),
        busy=(FULL,),
        budget={"nlp": 3.0},
        reason="not scaling up for run r1: project nlp's budget has $3.00 left",
    ),
    Case(
        "budget-that-pays-boots",
        (UP, DOWN),
        pending=(run("r1", project="nlp", rt=3600),),
        busy=(FULL,),
        budget={"nlp": 12.5},  # 1 h + 5 min boot at $10 = $10.83
        boot=("gpu-1",),
    ),
    Case(
        "budget-spent-by-the-first-run-stops-the-second",
        (UP, DOWN, DOWN),
        pending=(run("r1", 8, rt=3600), run("r2", 8, rt=3600)),
        busy=(FULL,),
        budget={"nlp": 15.0},
        boot=("gpu-1",),
        reason="not scaling up for run r2: project nlp's budget has $4.17 left",
    ),
    Case(
        "idle-past-idle-s-goes",
        (UP, UP),
        busy=(FULL,),
        idle={1: NOW - 700},
        down=("gpu-1",),
        reason="powering down node gpu-1: idle for 12 min (idle_s 10 min)",
    ),
    Case("idle-not-long-enough-stays", (UP, UP), busy=(FULL,), idle={1: NOW - 500}),
    Case(
        "min-nodes-keeps-one",
        (UP, UP),
        idle={0: NOW - 5000, 1: NOW - 4000},
        pool=pool(min_nodes=1),
        down=("gpu-0",),
    ),
    Case(
        "below-min-nodes-boots",
        (DOWN, DOWN, DOWN),
        pool=pool(min_nodes=2),
        boot=("gpu-0", "gpu-1"),
        reason="booting node gpu-0: pool p is below min_nodes (2)",
    ),
    Case(
        "nothing-waits-spare-node-drains-the-one-ending-first",
        (UP, UP, UP),
        busy=(
            Busy((("gpu-0", 2.0),), NOW + 9000),
            Busy((("gpu-1", 2.0),), NOW + 600),
            Busy((("gpu-2", 4.0),), NOW + 5000),
        ),
        drain=("gpu-1",),
        reason="draining node gpu-1: its runs end by about 10 min from now",
    ),
    Case(
        "no-drain-without-a-node-to-spare",
        (UP, UP),
        busy=(Busy((("gpu-0", 6.0),), NOW + 9000), Busy((("gpu-1", 4.0),), NOW + 600)),
    ),
    Case(
        "waiting-run-brings-a-draining-node-back-before-any-boot",
        (UP, DRAIN, DOWN),
        pending=(run("r1", 4),),
        busy=(FULL, Busy((("gpu-1", 2.0),), NOW + 7200)),
        undrain=("gpu-1",),
        reason="returning draining node gpu-1 to service for run r1",
    ),
    Case("drained-empty-goes-at-once", (UP, DRAIN), busy=(FULL,), idle={1: NOW}, down=("gpu-1",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_scale_table(case: Case) -> None:
    inputs = ScaleInputs(
        NOW,
        {"p": case.pool},
        nodes(*case.states, idle=case.idle),
        case.busy,
        case.pending,
        case.budget,
    )
    d = decide_scale(inputs)
    assert d.boot == case.boot
    assert d.power_down == case.down
    assert (d.drain, d.undrain) == (case.drain, case.undrain)
    if case.reason:
        assert any(r.startswith(case.reason) for r in d.reasons), d.reasons
    assert decide_scale(inputs) == d  # deterministic


def test_waiting_sentences_name_the_node_and_eta() -> None:
    d = decide_scale(ScaleInputs(NOW, {"p": pool()}, nodes(UP, BOOT), (FULL,), (run("r1"),), {}))
    assert d.waiting["r1"] == "waiting for node gpu-1 to boot (ETA 2 min)"
    d = decide_scale(
        ScaleInputs(NOW, {"p": pool()}, nodes(UP, DOWN), (FULL,), (run("r1"),), {"nlp": 3.0})
    )
    assert d.waiting["r1"] == "not scaling up: project nlp's budget has $3.00 left"
    assert d.scale_up(nodes(UP, DOWN)) == {}


def test_reserved_node_is_kept_and_next_check_is_the_idle_deadline() -> None:
    inputs = ScaleInputs(
        NOW,
        {"p": pool()},
        nodes(UP, UP, UP, idle={0: NOW - 5000, 1: NOW - 100, 2: NOW - 5000}),
        (),
        (),
        {},
        frozenset({"gpu-0"}),
    )
    d = decide_scale(inputs)
    assert d.power_down == ("gpu-2",)
    assert d.next_check_at == NOW - 100 + 600


def test_never_more_than_max_nodes_whatever_the_demand() -> None:
    p = pool(max_nodes=3)
    pending = tuple(run(f"r{i}", 8) for i in range(10))
    d = decide_scale(ScaleInputs(NOW, {"p": p}, nodes(BOOT, DOWN, DOWN, DOWN), (), pending, {}))
    assert len(d.boot) == 2  # one booting + two = max_nodes
    assert d.scale_up(nodes(BOOT, DOWN, DOWN, DOWN)) == {"p": 2}
