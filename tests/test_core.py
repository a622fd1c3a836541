"""The foundation policy: exact admissions, placements and reasons (table-driven), and the
invariants every decision must hold (hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mlops_gpu.core import ReasonCode, Snapshot, decide, request_problems
from mlops_gpu.model import Phase, Quota
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot, make_spec
from mlops_gpu.testing.builders import placed


@dataclass
class Case:
    snap: Snapshot
    admitted: dict[str, tuple[str, tuple[str, ...]]]  # run -> (node, devices)
    reasons: dict[str, ReasonCode] = field(default_factory=dict)
    reason_has: dict[str, str] = field(default_factory=dict)


N4 = [make_node("n1", 4)]
TWO = [make_node("n1", 4), make_node("n2", 4)]

CASES = {
    "one-run-lowest-devices": Case(
        make_snapshot(N4, [make_project()], [make_run("a", gpus=2)]),
        {"a": ("n1", ("0", "1"))},
    ),
    "two-runs-disjoint-devices": Case(
        make_snapshot(
            N4, [make_project()], [make_run("a", gpus=2, seq=1), make_run("b", gpus=2, seq=2)]
        ),
        {"a": ("n1", ("0", "1")), "b": ("n1", ("2", "3"))},
    ),
    "active-run-devices-are-skipped": Case(
        make_snapshot(
            N4,
            [make_project()],
            [make_run("b", gpus=2)],
            [make_run("a", gpus=2, phase=Phase.RUNNING, placement=placed("n1", ["1", "2"]))],
        ),
        {"b": ("n1", ("0", "3"))},
    ),
    "no-capacity-reason-names-free-block": Case(
        make_snapshot(
            N4,
            [make_project()],
            [make_run("b", gpus=3)],
            [make_run("a", gpus=2, phase=Phase.RUNNING, placement=placed("n1", ["0", "1"]))],
        ),
        {},
        {"b": ReasonCode.NO_CAPACITY},
        {"b": "largest free block is 2"},
    ),
    "priority-first": Case(
        make_snapshot(
            N4,
            [make_project()],
            [
                make_run("low", gpus=4, seq=1, priority="low"),
                make_run("hi", gpus=4, seq=2, priority="high"),
            ],
        ),
        {"hi": ("n1", ("0", "1", "2", "3"))},
        {"low": ReasonCode.NO_CAPACITY},
    ),
    "submit-order-within-class": Case(
        make_snapshot(
            N4,
            [make_project()],
            [
                make_run("late", gpus=4, seq=2, submitted_at=5),
                make_run("early", gpus=4, seq=1, submitted_at=1),
            ],
        ),
        {"early": ("n1", ("0", "1", "2", "3"))},
        {"late": ReasonCode.NO_CAPACITY},
    ),
    "quota-blocks-without-cohort": Case(
        make_snapshot(
            N4,
            [make_project(nominal=2)],
            [make_run("a", gpus=2, seq=1), make_run("b", gpus=1, seq=2)],
        ),
        {"a": ("n1", ("0", "1"))},
        {"b": ReasonCode.QUOTA},
        {"b": "borrowing limit 0"},
    ),
    "unlimited-borrowing-but-no-cohort": Case(
        make_snapshot(N4, [make_project(nominal=2, borrowing_limit=None)], [make_run("a", gpus=3)]),
        {},
        {"a": ReasonCode.QUOTA},
        {"a": "no cohort to borrow"},
    ),
    "borrow-within-cohort": Case(
        make_snapshot(
            N4,
            [make_project("p", 2, None, cohort="c"), make_project("q", 2, 0, cohort="c")],
            [make_run("a", "p", gpus=3)],
        ),
        {"a": ("n1", ("0", "1", "2"))},
    ),
    "borrowing-limit-caps": Case(
        make_snapshot(
            N4,
            [make_project("p", 2, 1, cohort="c"), make_project("q", 2, 0, cohort="c")],
            [make_run("a", "p", gpus=4)],
        ),
        {},
        {"a": ReasonCode.QUOTA},
        {"a": "borrowing limit 1"},
    ),
    "cohort-has-nothing-idle": Case(
        make_snapshot(
            N4,
            [make_project("p", 2, None, cohort="c"), make_project("q", 2, 0, cohort="c")],
            [make_run("a", "p", gpus=1)],
            [
                make_run("x", "p", gpus=2, phase=Phase.RUNNING, placement=placed("n1", ["0", "1"])),
                make_run("y", "q", gpus=2, phase=Phase.RUNNING, placement=placed("n1", ["2", "3"])),
            ],
        ),
        {},
        {"a": ReasonCode.QUOTA},
        {"a": "0 idle to lend"},
    ),
    "unknown-type-quota-is-zero": Case(
        make_snapshot([make_node("h", 4, "h100-80gb")], [make_project()], [make_run("a")]),
        {},
        {"a": ReasonCode.QUOTA},
    ),
    "gpu-type-list-any-of": Case(
        make_snapshot(
            [make_node("a", 1, "a100-80gb"), make_node("h", 4, "h100-80gb")],
            [make_project(quotas={"a100-80gb": Quota(4), "h100-80gb": Quota(4)})],
            [make_run("r", gpus=2, gpu_types=["a100-80gb", "h100-80gb"])],
        ),
        {"r": ("h", ("0", "1"))},
    ),
    "too-big-is-unschedulable": Case(
        make_snapshot(N4, [make_project()], [make_run("a", gpus=8)]),
        {},
        {"a": ReasonCode.UNSCHEDULABLE},
        {"a": "no node of this cluster"},
    ),
    # (small ends before x is expected to: one without a known end would take what big waits
    # for, issue 24)
    "best-effort-skips-blocked-head": Case(
        make_snapshot(
            N4,
            [make_project()],
            [make_run("big", gpus=4, seq=1), make_run("small", gpus=1, seq=2, max_runtime_s=300.0)],
            [
                make_run(
                    "x",
                    gpus=2,
                    phase=Phase.RUNNING,
                    placement=placed("n1", ["0", "1"]),
                    max_runtime_s=1500.0,
                )
            ],
        ),
        {"small": ("n1", ("2",))},
        {"big": ReasonCode.NO_CAPACITY},
    ),
    "strict-fifo-holds-the-line": Case(
        make_snapshot(
            N4,
            [make_project()],
            [make_run("big", gpus=4, seq=1), make_run("small", gpus=1, seq=2)],
            [make_run("x", gpus=2, phase=Phase.RUNNING, placement=placed("n1", ["0", "1"]))],
            queueing="strict-fifo",
        ),
        {},
        {"big": ReasonCode.NO_CAPACITY, "small": ReasonCode.QUEUED_BEHIND},
    ),
    "unschedulable-node-skipped": Case(
        make_snapshot(
            [make_node("n1", 4, schedulable=False), make_node("n2", 4)],
            [make_project()],
            [make_run("a", gpus=1)],
        ),
        {"a": ("n2", ("0",))},
    ),
    "unknown-project-invalid": Case(
        make_snapshot(N4, [make_project()], [make_run("a", "ghost")]),
        {},
        {"a": ReasonCode.INVALID},
        {"a": "unknown project"},
    ),
    "second-node-when-first-full": Case(
        make_snapshot(
            TWO, [make_project()], [make_run("a", gpus=3, seq=1), make_run("b", gpus=3, seq=2)]
        ),
        {"a": ("n1", ("0", "1", "2")), "b": ("n2", ("0", "1", "2"))},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decision(case: Case) -> None:
    d = decide(case.snap)
    got = {
        a.run_id: (a.placement.slots[0].node, a.placement.slots[0].devices) for a in d.admissions
    }
    assert got == case.admitted
    reasons = {p.run_id: p for p in d.pending}
    assert {k: v.reason_code for k, v in reasons.items()} == case.reasons
    for run_id, text in case.reason_has.items():
        assert text in reasons[run_id].reason
    assert d == decide(case.snap)  # pure: same snapshot, same decision


def test_gang_takes_distinct_nodes_or_none() -> None:
    nodes = [make_node("n1", 2, backend="slurm"), make_node("n2", 2, backend="slurm")]
    snap = make_snapshot(nodes, [make_project()], [make_run("g", gpus=2, nodes=2)])
    (adm,) = decide(snap).admissions
    assert adm.placement.node_names == ("n1", "n2")
    snap = make_snapshot(nodes, [make_project()], [make_run("g", gpus=2, nodes=3)])
    d = decide(snap)
    assert not d.admissions and d.pending[0].reason_code is ReasonCode.UNSCHEDULABLE


@pytest.mark.parametrize(
    ("spec_kw", "needle"),
    [
        ({"gpus": 0}, "gpus must be a positive integer"),
        ({"gpus": -1}, "gpus must not be negative"),
        ({"project": "nope"}, "unknown project 'nope'"),
        ({"gpu_types": ["h100"]}, "unknown GPU type 'h100'"),
        ({"gpus": 5}, "largest node has 4"),
        ({"priority": "urgent"}, "unknown priority class"),
        ({"nodes": 0}, "nodes must be at least 1"),
        ({"command": ()}, "empty command"),
    ],
    ids=[
        "zero-gpus",
        "negative-gpus",
        "unknown-project",
        "unknown-type",
        "too-many-gpus",
        "unknown-priority",
        "zero-nodes",
        "empty-command",
    ],
)
def test_request_problems(spec_kw: dict[str, object], needle: str) -> None:
    project = str(spec_kw.pop("project", "p"))
    spec = make_spec(project, **spec_kw)  # type: ignore[arg-type]
    problems = request_problems(
        spec,
        projects={"p": make_project()},
        gpu_types={"a100-80gb": None},  # type: ignore[dict-item]
        priority_classes={"normal": 100},
        nodes=N4,
    )
    assert any(needle in p for p in problems), problems


# The invariants every decision keeps are property-tested in tests/core/test_invariants.py.
