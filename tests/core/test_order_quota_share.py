"""Policy items 1 (priority and queueing), 2 (quotas and cohorts), 3 (fair share)."""

from __future__ import annotations

import pytest

from mlops_gpu.core import ReasonCode as RC
from mlops_gpu.testing import make_snapshot as snap
from tests.core.cases import A100, H100, Case, Quota, busy, check, make_node, make_project
from tests.core.cases import make_run as run

N4 = [make_node("n1", 4)]
P = make_project("p", 8)

PRIORITY = {
    "high-before-low": Case(
        snap(
            N4,
            [P],
            [run("lo", gpus=4, seq=1, priority="low"), run("hi", gpus=4, seq=2, priority="high")],
        ),
        admit={"hi": "n1"},
        codes={"lo": RC.NO_CAPACITY},
    ),
    "submit-time-within-class": Case(
        snap(
            N4,
            [P],
            [
                run("late", gpus=4, seq=1, submitted_at=9),
                run("early", gpus=4, seq=2, submitted_at=1),
            ],
            order="submit",
        ),
        admit={"early": "n1"},
        codes={"late": RC.NO_CAPACITY},
    ),
    "shortest-max-runtime-first-by-default": Case(
        snap(
            N4,
            [P],
            [
                run("long", gpus=4, seq=1, max_runtime_s=7200.0),
                run("short", gpus=4, seq=2, submitted_at=5, max_runtime_s=600.0),
            ],
        ),
        admit={"short": "n1"},
        codes={"long": RC.NO_CAPACITY},
    ),
    "shortest-runs-without-max-runtime-go-last": Case(
        snap(
            N4,
            [P],
            [
                run("unknown", gpus=4, seq=1),
                run("estimated", gpus=4, seq=2, submitted_at=5, max_runtime_s=86400.0),
            ],
        ),
        admit={"estimated": "n1"},
        codes={"unknown": RC.NO_CAPACITY},
    ),
    "seq-breaks-ties": Case(
        snap(N4, [P], [run("b", gpus=4, seq=2), run("a", gpus=4, seq=1)]), admit={"a": "n1"}
    ),
    "las-least-attained-first": Case(
        snap(
            N4,
            [P],
            [run("old", gpus=4, seq=1, attained_gpu_s=50_000), run("new", gpus=4, seq=2)],
            order="las",
        ),
        admit={"new": "n1"},
        codes={"old": RC.NO_CAPACITY},
    ),
    "las-same-level-keeps-submit-order": Case(
        snap(
            N4,
            [P],
            [run("a", gpus=4, seq=1, attained_gpu_s=10), run("b", gpus=4, seq=2)],
            order="las",
        ),
        admit={"a": "n1"},
    ),
    "strict-fifo-blocks-behind": Case(
        snap(
            N4,
            [P],
            [run("big", gpus=4, seq=1), run("small", seq=2)],
            [busy("x", "p", "n1", ["0"])],
            queueing="strict-fifo",
        ),
        codes={"big": RC.NO_CAPACITY, "small": RC.QUEUED_BEHIND},
        says={"small": "big"},
    ),
    # (x has a max_runtime and small ends before it: a run without a known end, or one that
    # would end later, would take what big waits for: RESERVED)
    "best-effort-passes-blocked-head": Case(
        snap(
            N4,
            [P],
            [run("big", gpus=4, seq=1), run("small", seq=2, max_runtime_s=300.0)],
            [busy("x", "p", "n1", ["0"], max_runtime_s=1500.0)],
        ),
        admit={"small": "n1"},
        codes={"big": RC.NO_CAPACITY},
    ),
    "strict-fifo-is-per-project": Case(
        snap(
            N4,
            [P, make_project("q", 8)],
            [
                run("big", gpus=4, seq=1),
                run("small", seq=2),
                run("other", "q", seq=3, max_runtime_s=300.0),
            ],
            [busy("x", "p", "n1", ["0"], max_runtime_s=1500.0)],
            queueing="strict-fifo",
        ),
        admit={"other": "n1"},
        codes={"small": RC.QUEUED_BEHIND},
    ),
}

C = "org"
QUOTAS = {
    "within-nominal": Case(snap(N4, [make_project("p", 2)], [run("a", gpus=2)]), admit={"a": "n1"}),
    "borrow-from-cohort": Case(
        snap(
            N4,
            [make_project("p", 2, None, cohort=C), make_project("q", 2, cohort=C)],
            [run("a", gpus=3)],
        ),
        admit={"a": "n1"},
    ),
    "borrowing-limit-caps": Case(
        snap(
            N4,
            [make_project("p", 2, 1, cohort=C), make_project("q", 2, cohort=C)],
            [run("a", gpus=4)],
        ),
        codes={"a": RC.QUOTA},
        says={"a": "borrowing limit 1"},
    ),
    "lending-limit-caps": Case(
        snap(
            N4,
            [
                make_project("p", 1, None, cohort=C),
                make_project("q", quotas={A100: Quota(3, 0, 1)}, cohort=C),
            ],
            [run("a", gpus=3)],
        ),
        codes={"a": RC.QUOTA},
        says={"a": "1 idle to lend"},
    ),
    "lending-limit-allows-its-share": Case(
        snap(
            N4,
            [
                make_project("p", 1, None, cohort=C),
                make_project("q", quotas={A100: Quota(3, 0, 1)}, cohort=C),
            ],
            [run("a", gpus=2)],
        ),
        admit={"a": "n1"},
    ),
    "no-cohort-no-borrowing": Case(
        snap(N4, [make_project("p", 2, None)], [run("a", gpus=3)]),
        codes={"a": RC.QUOTA},
        says={"a": "no cohort to borrow from"},
    ),
    "no-quota-for-type": Case(
        snap([make_node("h", 4, H100)], [P], [run("a")]), codes={"a": RC.QUOTA}
    ),
    "separate-trees-do-not-share": Case(
        snap(
            N4,
            [make_project("p", 1, None, cohort="x"), make_project("q", 3, cohort="y")],
            [run("a", gpus=2)],
        ),
        codes={"a": RC.QUOTA},
        says={"a": "0 idle to lend"},
    ),
    "borrowed-counts-against-lenders-idle": Case(
        snap(
            N4,
            [make_project("p", 2, None, cohort=C), make_project("q", 2, cohort=C)],
            [run("a", "p", gpus=1)],
            [busy("x", "p", "n1", ["0", "1", "2"]), busy("y", "q", "n1", ["3"])],
        ),
        codes={"a": RC.QUOTA},
        says={"a": "0 idle to lend"},
    ),
}


def _tree_case() -> Case:
    from dataclasses import replace

    from mlops_gpu.model import Cohort

    s = snap(
        N4,
        [make_project("p", 1, None, cohort="team-a"), make_project("q", 3, cohort="team-b")],
        [run("a", gpus=3)],
    )
    cohorts = {
        "org": Cohort("org"),
        "team-a": Cohort("team-a", "org"),
        "team-b": Cohort("team-b", "org"),
    }
    return Case(replace(s, cohorts=cohorts), admit={"a": "n1"})


QUOTAS["cohort-tree-shares-through-root"] = _tree_case()

TWO = [make_node("n1", 2), make_node("n2", 2)]
FAIR = {
    "lower-history-first": Case(
        snap(
            N4,
            [make_project("p", 4), make_project("q", 4)],
            [run("p1", "p", gpus=4, seq=1), run("q1", "q", gpus=4, seq=2)],
            usage_history={("p", A100): 4 * 3600.0},
        ),
        admit={"q1": "n1"},
        codes={"p1": RC.NO_CAPACITY},
    ),
    "weight-favours": Case(
        snap(
            N4,
            [make_project("p", 4), make_project("q", 4, weight=2.0)],
            [run("p1", "p", gpus=4, seq=1), run("q1", "q", gpus=4, seq=2)],
            usage_history={("p", A100): 3600.0, ("q", A100): 3600.0},
        ),
        admit={"q1": "n1"},
    ),
    "current-allocation-counts": Case(
        snap(
            [make_node("n1", 4), make_node("n2", 1)],
            [make_project("p", 8), make_project("q", 4)],
            [run("p1", "p", seq=1), run("q1", "q", seq=2)],
            [busy("x", "p", "n1", ["0", "1", "2", "3"])],
        ),
        admit={"q1": "n2"},
        codes={"p1": RC.NO_CAPACITY},
    ),
    "fair-share-off-means-submit-order": Case(
        snap(
            N4,
            [make_project("p", 4), make_project("q", 4)],
            [run("p1", "p", gpus=4, seq=1), run("q1", "q", gpus=4, seq=2)],
            usage_history={("p", A100): 4 * 3600.0},
            fair_share=False,
        ),
        admit={"p1": "n1"},
    ),
    "fair-share-off-oldest-head-first-across-projects": Case(
        snap(
            N4,
            [make_project("p", 4), make_project("q", 4)],
            [run("p1", "p", gpus=4, seq=2), run("q1", "q", gpus=4, seq=1)],
            fair_share=False,
        ),
        admit={"q1": "n1"},
    ),
    "interleaves-as-it-admits": Case(
        snap(
            TWO,
            [make_project("p", 4), make_project("q", 4)],
            [
                *(run(f"p{i}", "p", seq=i) for i in range(4)),
                *(run(f"q{i}", "q", seq=10 + i) for i in range(4)),
            ],
        ),
        # p, q, p, q: fair share alternates; best fit fills n1 before n2
        admit={"p0": "n1", "q0": "n1", "p1": "n2", "q1": "n2"},
    ),
    "dominant-share-across-types": Case(
        snap(
            [make_node("a", 4), make_node("h", 4, H100)],
            [
                make_project("p", quotas={A100: Quota(4), H100: Quota(4)}),
                make_project("q", quotas={A100: Quota(4), H100: Quota(4)}),
            ],
            [
                run("p1", "p", gpus=4, seq=1, gpu_types=[A100]),
                run("q1", "q", gpus=4, seq=2, gpu_types=[A100]),
            ],
            [busy("x", "p", "h", ["0", "1", "2"], gpu_type=H100)],
        ),
        admit={"q1": "a"},
    ),
    "history-decays-into-share-not-block": Case(
        snap(
            N4,
            [make_project("p", 4), make_project("q", 4)],
            [run("p1", "p", gpus=2, seq=1), run("q1", "q", gpus=2, seq=2)],
            usage_history={("p", A100): 10 * 3600.0},
        ),
        admit={"p1": "n1", "q1": "n1"},
    ),
}

ALL = {
    **{f"1-{k}": v for k, v in PRIORITY.items()},
    **{f"2-{k}": v for k, v in QUOTAS.items()},
    **{f"3-{k}": v for k, v in FAIR.items()},
}


@pytest.mark.parametrize("case", ALL.values(), ids=ALL.keys())
def test_policy(case: Case) -> None:
    check(case)
