"""``controller.pools.PoolControl``, the live scheduler's side of elastic pools, on a backend that
reports power states (as the Slurm backend does): which powered-down nodes the core may use,
which runs are demand, the reasons and ETAs that replace the core's, ``max_nodes``, and pools
that are not acted on. The real cluster is in ``tests/slurm/test_slurm_pools.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mlops_gpu.config.pools import not_acted_on
from mlops_gpu.controller import Runtime
from mlops_gpu.controller.pools import OPEN_GRACE_S, PoolControl
from mlops_gpu.core.decision import PendingReason, ReasonCode
from mlops_gpu.model import Node, NodeState, Phase, Run
from mlops_gpu.testing import config_yaml, make_node, make_run
from mlops_gpu.testing.builders import placed

NOW = 1000.0


class PoweredBackend:
    """The part of a backend ``PoolControl`` reads: power states by node."""

    def __init__(self, states: dict[str, NodeState]) -> None:
        self.states = states

    def power_states(self) -> dict[str, NodeState]:
        return dict(self.states)


def runtime(tmp_path: Path, backend_type: str = "slurm", **pool: Any) -> Runtime:
    data = yaml.safe_load(config_yaml(projects={"p": (32, 0)}))
    data["gpu_types"] = {"l4": {"price_per_hour": 1}}
    data["backends"] = {"cloud": {"type": "slurm", "cluster": "c", "gres_types": {"l4": "l4"}}}
    if backend_type == "local":
        data["backends"] = {"cloud": {"type": "local", "nodes": [
            {"name": "sc1", "gpu_type": "l4", "gpus": 4}]}}  # fmt: skip
    data["projects"]["p"]["quotas"] = {"l4": {"nominal": 32, "borrowing_limit": 0}}
    data["pools"] = {"burst": {"backend": "cloud", "gpu_type": "l4", "gpus_per_node": 4,
                               "max_nodes": 4, "boot_s": 60, **pool}}  # fmt: skip
    path = tmp_path / "mlops-gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return Runtime.load(path)


def control(rt: Runtime, states: dict[str, NodeState]) -> tuple[PoolControl, PoweredBackend]:
    backend = PoweredBackend(states)
    rt.__dict__["backends"] = {"cloud": backend}  # (``Runtime.backends`` is a cached property)
    return PoolControl(rt), backend


def cloud(states: dict[str, NodeState]) -> tuple[Node, ...]:
    """The inventory the Slurm backend would list: powered-down nodes unschedulable."""
    return tuple(
        make_node(n, 4, "l4", "cloud", schedulable=s is not NodeState.POWERED_DOWN)
        for n, s in sorted(states.items())
    )


def waiting(runs: list[Run], code: ReasonCode = ReasonCode.NO_CAPACITY) -> list[PendingReason]:
    return [PendingReason(r.id, code, "waiting for GPUs", None) for r in runs]


DOWN4 = {f"sc{i}": NodeState.POWERED_DOWN for i in range(1, 5)}


def test_runs_waiting_for_capacity_boot_nodes_and_are_told_when(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    pc, backend = control(rt, dict(DOWN4))
    nodes = cloud(DOWN4)
    assert not any(n.schedulable for n in pc.open(nodes, NOW))  # nothing opened yet
    runs = [make_run(f"r{i}", gpu_types=["l4"]) for i in range(5)]
    out = pc.explain(NOW, waiting(runs), {r.id: r for r in runs}, [], nodes)
    # five one-GPU runs: two 4-GPU nodes, packed first-fit in name order
    assert sorted(pc.opened) == ["sc1", "sc2"]
    assert [o.reason for o in out] == ["waiting for node sc1 to boot (ETA 1 min)"] * 4 + [
        "waiting for node sc2 to boot (ETA 1 min)"
    ]
    assert {o.eta for o in out} == {NOW + 60} and {o.reason_code for o in out} == {
        ReasonCode.NO_CAPACITY
    }
    opened = {n.name: n.schedulable for n in pc.open(nodes, NOW + 1)}
    assert opened == {"sc1": True, "sc2": True, "sc3": False, "sc4": False}
    # the next decision counts them as booting: no more boots, the same waits
    again = pc.explain(NOW + 1, waiting(runs), {r.id: r for r in runs}, [], nodes)
    assert sorted(pc.opened) == ["sc1", "sc2"]
    assert again[0].reason == "waiting for node sc1 to boot (ETA 1 min)"
    # Slurm resumed sc1 (a job was allocated it): the backend's own listing governs it now
    backend.states["sc1"] = NodeState.BOOTING
    pc.open(nodes, NOW + 2)
    assert sorted(pc.opened) == ["sc2"]
    late = pc.explain(NOW + 30, waiting(runs), {r.id: r for r in runs}, [], nodes)
    assert late[0].eta == NOW + 60  # still counted from the decision to boot it
    # sc2's run went elsewhere: it is closed after boot_s and the grace
    assert not any(
        n.schedulable for n in pc.open(nodes, NOW + 61 + OPEN_GRACE_S) if n.name != "sc1"
    )
    assert pc.opened == {}


def test_only_runs_waiting_for_capacity_are_demand(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    pc, _ = control(rt, dict(DOWN4))
    quota = make_run("q", gpu_types=["l4"])
    other = make_run("a", gpu_types=["a100-80gb"])  # no pool of its GPU type
    reasons = waiting([quota], ReasonCode.QUOTA) + waiting([other])
    out = pc.explain(NOW, reasons, {"q": quota, "a": other}, [], cloud(DOWN4))
    assert out == reasons and pc.opened == {}


def test_a_run_that_fits_where_a_run_ends_soon_boots_nothing(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    states = {"sc1": NodeState.UP, "sc2": NodeState.POWERED_DOWN}
    pc, _ = control(rt, states)
    busy = make_run("b", gpus=4, phase=Phase.RUNNING, started_at=NOW - 10, max_runtime_s=30,
                    placement=placed("sc1", ["0", "1", "2", "3"], "l4", "cloud"))  # fmt: skip
    long = make_run("long", gpus=4, phase=Phase.RUNNING, started_at=NOW, placement=None)
    new = make_run("n", gpus=1, gpu_types=["l4"])
    out = pc.explain(NOW, waiting([new]), {"n": new}, [busy, long], cloud(states))
    assert pc.opened == {} and out == waiting([new])  # sc1 frees in 20 s, sooner than a boot


def test_at_max_nodes_the_wait_says_so(tmp_path: Path) -> None:
    rt = runtime(tmp_path, max_nodes=1)
    pc, _ = control(rt, dict(DOWN4))
    runs = [make_run(f"r{i}", gpus=4) for i in range(2)]
    out = pc.explain(NOW, waiting(runs), {r.id: r for r in runs}, [], cloud(DOWN4))
    assert list(pc.opened) == ["sc1"]
    assert out[1].reason == "waiting for capacity: pool burst is at max_nodes (1)"
    assert out[1].eta is None


def test_pools_of_backends_without_power_control_are_not_acted_on(tmp_path: Path) -> None:
    rt = runtime(tmp_path, "local")
    note = not_acted_on(rt.cfg.pools, rt.cfg.backends)
    assert note is not None and note.startswith("pools: burst configured but not acted on")
    pc = PoolControl(rt)
    runs = [make_run("r", gpu_types=["l4"])]
    assert pc.explain(NOW, waiting(runs), {"r": runs[0]}, [], rt.nodes()) == waiting(runs)
    (tmp_path / "s").mkdir()
    slurm = runtime(tmp_path / "s")
    assert not_acted_on(slurm.cfg.pools, slurm.cfg.backends) is None


def test_a_project_budget_that_cannot_pay_for_a_node_boots_nothing(tmp_path: Path) -> None:
    rt = runtime(tmp_path, price_per_node_hour=10)
    data = yaml.safe_load((tmp_path / "mlops-gpu.yaml").read_text())
    data["projects"]["p"]["budget"] = {"window_s": 86400, "usd": 20}
    (tmp_path / "mlops-gpu.yaml").write_text(yaml.safe_dump(data))
    rt = Runtime.load(tmp_path / "mlops-gpu.yaml")
    pc, _ = control(rt, dict(DOWN4))
    run = make_run("r", gpus=4, max_runtime_s=3600)  # a node for 1 h + 1 min: $10.17
    spent = {"p": (5.0, 12.0)}  # $8 left
    out = pc.explain(NOW, waiting([run]), {"r": run}, [], cloud(DOWN4), spent)
    assert pc.opened == {}
    assert out[0].reason == "not scaling up: project p's budget has $8.00 left"
    out = pc.explain(NOW, waiting([run]), {"r": run}, [], cloud(DOWN4), {"p": (1.0, 2.0)})
    assert list(pc.opened) == ["sc1"] and out[0].reason.startswith("waiting for node sc1")
