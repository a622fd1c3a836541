"""ETAs (policy item 8, ``backfill.EtaBook`` and ``quota_eta``) on hand-computed snapshots: a
run ahead in the queue gives its GPUs back at its own ETA plus its max_runtime, and a run that
borrows from its cohort is told when the cohort's members will hold no more than their nominal
quotas together."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlops_gpu.core import ReasonCode as RC
from mlops_gpu.testing import make_snapshot as snap
from tests.core.cases import Case, Quota, busy, check, make_node, make_project
from tests.core.cases import make_run as run

P = make_project("p", 32)
N1N2 = [make_node("n1", 4), make_node("n2", 4)]
C = "org"

CASES = {
    # n1 frees at 1500, n2 at 2500. r1 (4 GPUs) starts at 1500 and, by its max_runtime 500,
    # gives them back at 2000: r2 (4 GPUs) can start then, before n2 frees.
    "a-run-ahead-gives-its-gpus-back": Case(
        snap(
            N1N2,
            [P],
            [run("r1", gpus=4, seq=1, max_runtime_s=500.0), run("r2", gpus=4, seq=2)],
            [
                busy("x", "p", "n1", ["0", "1", "2", "3"], max_runtime_s=1500.0),
                busy("z", "p", "n2", ["0", "1", "2", "3"], max_runtime_s=2500.0),
            ],
        ),
        eta={"r1": 1500.0, "r2": 2000.0},
    ),
    # One node of 4: x (4 GPUs) ends at 1500; r1 and r2 (4 GPUs, 1000 s each) follow in turn,
    # and r3 after both: 1500, 2500, 3500 (before, r2 and r3 had none: the node never frees
    # twice).
    "a-queue-drains-in-turn": Case(
        snap(
            [make_node("n1", 4)],
            [P],
            [
                run("r1", gpus=4, seq=1, max_runtime_s=1000.0),
                run("r2", gpus=4, seq=2, max_runtime_s=1000.0),
                run("r3", gpus=4, seq=3, max_runtime_s=1000.0),
            ],
            [busy("x", "p", "n1", ["0", "1", "2", "3"], max_runtime_s=1500.0)],
        ),
        eta={"r1": 1500.0, "r2": 2500.0, "r3": 3500.0},
    ),
    # p and q lend to each other (nominal 4 each, no borrowing limit) on one node of 8. q holds
    # its 4 until 1200, p its 4 until 3000: p's new run must borrow, and the cohort has room
    # once q's run ends (before: "no ETA: it waits for quota its cohort lends").
    "a-cohort-borrower-waits-for-the-cohort": Case(
        snap(
            [make_node("n1", 8)],
            [make_project("p", 4, None, cohort=C), make_project("q", 4, None, cohort=C)],
            [run("a", "p", gpus=2)],
            [
                busy("x", "p", "n1", ["0", "1", "2", "3"], max_runtime_s=3000.0),
                busy("y", "q", "n1", ["4", "5", "6", "7"], max_runtime_s=1200.0),
            ],
            cohorts=[C],
            preemption=False,
        ),
        codes={"a": RC.QUOTA},
        eta={"a": 1200.0},
    ),
    # The run needs both quota and GPUs, and is told the later of the two: the cohort's
    # nominal (8) exceeds the cluster (6 GPUs). p holds n1's 4 until 2200, q n2's 2 until
    # 1200: a (p, 4 GPUs) has quota room once q's run ends, GPUs once p's does.
    "quota-and-gpus-the-later-of-the-two": Case(
        snap(
            [make_node("n1", 4), make_node("n2", 2)],
            [make_project("p", 4, None, cohort=C), make_project("q", 4, None, cohort=C)],
            [run("a", "p", gpus=4)],
            [
                busy("x", "p", "n1", ["0", "1", "2", "3"], max_runtime_s=2200.0),
                busy("y", "q", "n2", ["0", "1"], max_runtime_s=1200.0),
            ],
            cohorts=[C],
            preemption=False,
        ),
        codes={"a": RC.QUOTA},
        eta={"a": 2200.0},
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_eta(case: Case) -> None:
    check(case)


def test_no_cohort_eta_under_a_lending_limit() -> None:
    """The cohort's room is its members' nominal sum only without lending limits: with one,
    no cohort ETA is promised (and without it, the same snapshot has one); the run, the anchor
    of the EASY reservation, is then told the reservation's time: when its own project's run
    has ended (3000) and it fits its nominal quota (issue 24 item 1)."""
    case = CASES["a-cohort-borrower-waits-for-the-cohort"]
    check(case)
    lent = replace(
        case.snap,
        projects={
            **case.snap.projects,
            "q": make_project("q", cohort=C, quotas={"a100-80gb": Quota(4, None, 1)}),
        },
    )
    check(Case(lent, codes={"a": RC.QUOTA}, eta={"a": 3000.0}))


@pytest.mark.parametrize("first", ["head", "a"])
def test_strict_fifo_books_the_runs_behind_in_queue_order(first: str) -> None:
    """Runs held behind a blocked head (strict FIFO) are booked in their queue's order,
    whatever order the snapshot lists them in (policy item 9). n1 (4 GPUs) frees at 1500; head
    (4 GPUs) starts then and ends by 2500, a (2 GPUs) follows at 2500 and b (4 GPUs) once a
    ends, at 3500. (Booked by subqueue, b came before a when head was listed first.)"""
    head = run("head", gpus=4, seq=1, max_runtime_s=1000.0)
    a = run("a", gpus=2, seq=2, max_runtime_s=1000.0)
    b = run("b", gpus=4, seq=3, max_runtime_s=1000.0)
    pending = [head, a, b] if first == "head" else [a, head, b]
    check(
        Case(
            snap(
                [make_node("n1", 4)],
                [P],
                pending,
                [busy("x", "p", "n1", ["0", "1", "2", "3"], max_runtime_s=1500.0)],
                queueing="strict-fifo",
            ),
            codes={"a": RC.QUEUED_BEHIND, "b": RC.QUEUED_BEHIND},
            eta={"head": 1500.0, "a": 2500.0, "b": 3500.0},
        )
    )
