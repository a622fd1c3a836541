"""Policy items 4 (placement) and 5 (preemption)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from mlops_gpu.core import ReasonCode as RC
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import BackendCapabilities
from mlops_gpu.testing import make_snapshot as snap
from tests.core.cases import (
    A100,
    H100,
    Case,
    Quota,
    busy,
    check,
    make_node,
    make_project,
    placed,
    placed_gang,
)
from tests.core.cases import make_run as run

P = make_project("p", 32)
MIG = MappingProxyType({"1g.10gb": ("m0", "m1", "m2"), "3g.40gb": ("m3",)})
RACKS = [
    make_node("a1", 4, labels={"rack": "a"}),
    make_node("b1", 4, labels={"rack": "b"}),
    make_node("b2", 4, labels={"rack": "b"}),
]


def _shared(name: str = "s1") -> object:
    return make_node(name, 2, shared=True, gpu_memory_mb=80_000)


def _sharing(fraction: float) -> object:
    """Run "s" of project p, active, holding ``fraction`` of device 0 of ``_shared()``."""
    return run(
        "s",
        gpu_fraction=fraction,
        phase=busy("z", "p", "s1", ["0"]).phase,
        placement=placed("s1", ["0"], fraction=fraction),
    )


PLACEMENT = {
    "best-fit-fullest-node": Case(
        snap(
            [make_node("n1", 4), make_node("n2", 4)],
            [P],
            [run("a")],
            [busy("x", "p", "n2", ["0", "1", "2"])],
        ),
        admit={"a": "n2"},
        devices={"a": ("3",)},
    ),
    "multi-gpu-on-exactly-fitting-node": Case(
        snap(
            [make_node("n1", 8), make_node("n2", 8)],
            [P],
            [run("a", gpus=4)],
            [busy("x", "p", "n1", ["0", "1"]), busy("y", "p", "n2", ["0", "1", "2", "3"])],
        ),
        admit={"a": "n2"},
        devices={"a": ("4", "5", "6", "7")},
    ),
    "gang-all-nodes-at-once": Case(
        snap([make_node("n1", 2), make_node("n2", 2)], [P], [run("g", gpus=2, nodes=2)]),
        admit={"g": ("n1", "n2")},
    ),
    "gang-whole-or-nothing": Case(
        snap(
            [make_node("n1", 2), make_node("n2", 2)],
            [P],
            [run("g", gpus=2, nodes=2)],
            [busy("x", "p", "n2", ["0"])],
        ),
        codes={"g": RC.NO_CAPACITY},
    ),
    "gang-needs-multi-node-backend": Case(
        snap(
            [make_node("n1", 2), make_node("n2", 2)],
            [P],
            [run("g", gpus=2, nodes=2)],
            capabilities={"local": BackendCapabilities(multi_node=False)},
        ),
        codes={"g": RC.UNSCHEDULABLE},
    ),
    "gang-one-backend": Case(
        snap(
            [make_node("n1", 2, backend="k8s"), make_node("n2", 2, backend="slurm")],
            [P],
            [run("g", gpus=2, nodes=2)],
        ),
        codes={"g": RC.UNSCHEDULABLE},
    ),
    "topology-required-same-rack": Case(
        snap(RACKS, [P], [run("g", gpus=2, nodes=2, topology_key="rack", topology_required=True)]),
        admit={"g": ("b1", "b2")},
    ),
    "topology-required-unsatisfiable": Case(
        snap(
            RACKS,
            [P],
            [run("g", gpus=2, nodes=2, topology_key="rack", topology_required=True)],
            [busy("x", "p", "b2", ["0", "1", "2"])],
        ),
        codes={"g": RC.NO_CAPACITY},
    ),
    "topology-preferred-falls-back": Case(
        snap(
            RACKS,
            [P],
            [run("g", gpus=2, nodes=2, topology_key="rack")],
            [busy("x", "p", "b2", ["0", "1", "2"])],
        ),
        admit={"g": ("a1", "b1")},
    ),
    "gpu-type-any-of": Case(
        snap(
            [make_node("a", 1), make_node("h", 4, H100)],
            [make_project("p", quotas={A100: Quota(4), H100: Quota(4)})],
            [run("r", gpus=2, gpu_types=[A100, H100])],
        ),
        admit={"r": "h"},
    ),
    "mig-slice-of-profile": Case(
        snap([make_node("m", 0, mig=MIG)], [P], [run("r", mig="1g.10gb")]),
        admit={"r": "m"},
        devices={"r": ("m0",)},
    ),
    "mig-profile-missing": Case(
        snap([make_node("m", 0, mig=MIG)], [P], [run("r", mig="2g.20gb")]),
        codes={"r": RC.UNSCHEDULABLE},
    ),
    "mig-slices-run-out": Case(
        snap(
            [make_node("m", 0, mig=MIG)],
            [P],
            [run("r", mig="3g.40gb")],
            [busy("x", "p", "m", ["m3"])],
        ),
        codes={"r": RC.NO_CAPACITY},
    ),
    "shared-two-halves-one-device": Case(
        snap(
            [_shared()], [P], [run("a", gpu_fraction=0.5, seq=1), run("b", gpu_fraction=0.5, seq=2)]
        ),
        admit={"a": "s1", "b": "s1"},
        devices={"a": ("0",), "b": ("0",)},
    ),
    "shared-memory-cap-too-big": Case(
        snap([_shared()], [P], [run("a", gpu_memory_mb=90_000)]), codes={"a": RC.UNSCHEDULABLE}
    ),
    "whole-gpu-avoids-shared-device": Case(
        snap(
            [_shared()],
            [P],
            [run("w", gpus=2)],
            [_sharing(0.25)],
        ),
        codes={"w": RC.NO_CAPACITY},
    ),
    "shared-needs-shared-node": Case(
        snap([make_node("n1", 2)], [P], [run("a", gpu_fraction=0.5)]), codes={"a": RC.UNSCHEDULABLE}
    ),
    # A memory-only request counts as a whole GPU until placed, then is charged its memory's
    # share (20,000 of 80,000 MB: 0.25): with 0.5 of quota left it fits, though no victim
    # could make room for a whole GPU (once skipped as surely over quota).
    "shared-memory-share-within-quota-left": Case(
        snap(
            [_shared()],
            [make_project("p", 1)],
            [run("a", gpu_memory_mb=20_000)],
            [_sharing(0.5)],
            preemption=False,
        ),
        admit={"a": "s1"},
    ),
}

PREEMPT_P = make_project("p", 4)
N4 = [make_node("n1", 4)]
ORG = "org"
LENDER = make_project("q", 2, cohort=ORG)
BORROWER = make_project("p", 2, None, cohort=ORG)


def quick_vs_long(
    long_max_runtime: float | None,
    checkpoint: float | None = 500.0,
    started: float = 0.0,
    **policy: object,
) -> Snapshot:
    """At 1,000 s, "quick" (4 GPUs, max_runtime 600 s) waits while "long" of the same project
    and class, started at ``started`` (0) and checkpointed at ``checkpoint`` (500), holds the
    only node's 4 GPUs."""
    return snap(
        N4,
        [make_project("p", 8)],
        [run("quick", gpus=4, max_runtime_s=600.0)],
        [
            busy(
                "long",
                "p",
                "n1",
                ["0", "1", "2", "3"],
                max_runtime_s=long_max_runtime,
                last_checkpoint_at=checkpoint,
                admitted_at=started,
            )
        ],
        now=1000.0,
        **policy,
    )


ALL4 = ("0", "1", "2", "3")


PREEMPTION = {
    "higher-priority-preempts-lower": Case(
        snap(
            N4,
            [PREEMPT_P],
            [run("hi", gpus=4, priority="high")],
            [busy("lo", "p", "n1", ["0", "1", "2", "3"], priority="low")],
        ),
        # rule A: the preemptor is admitted in the same decision, on its victim's devices (a
        # lower class needs neither a checkpoint nor a minimum runtime)
        admit={"hi": "n1"},
        devices={"hi": ALL4},
        preempt={"lo"},
    ),
    "equal-priority-is-not-preempted": Case(
        snap(N4, [PREEMPT_P], [run("a", gpus=4)], [busy("b", "p", "n1", ["0", "1", "2", "3"])]),
        codes={"a": RC.QUOTA},
    ),
    "non-preemptible-is-never-a-victim": Case(
        snap(
            N4,
            [PREEMPT_P],
            [run("hi", gpus=4, priority="high")],
            [busy("lo", "p", "n1", ["0", "1", "2", "3"], priority="low", preemptible=False)],
        ),
        codes={"hi": RC.QUOTA},
    ),
    "reclaim-borrowed-quota": Case(
        snap(
            N4,
            [BORROWER, LENDER],
            [run("q1", "q", gpus=2)],
            [busy("b1", "p", "n1", ["0", "1"]), busy("b2", "p", "n1", ["2", "3"])],
        ),
        admit={"q1": "n1"},
        devices={"q1": ("0", "1")},
        preempt={"b1"},
    ),
    "no-reclaim-from-non-borrower": Case(
        snap(
            N4,
            [make_project("p", 4, cohort=ORG), make_project("q", 2, None, cohort=ORG)],
            [run("q1", "q", gpus=2)],
            [busy("x", "p", "n1", ["0", "1", "2", "3"])],
        ),
        codes={"q1": RC.NO_CAPACITY},
    ),
    "no-reclaim-beyond-own-nominal": Case(
        snap(
            N4,
            [BORROWER, make_project("q", 1, None, cohort=ORG)],
            [run("q1", "q", gpus=2)],
            [busy("b1", "p", "n1", ["0", "1"]), busy("b2", "p", "n1", ["2", "3"])],
        ),
        preempt=set(),
    ),
    "victim-with-recent-checkpoint": Case(
        snap(
            N4,
            [PREEMPT_P],
            [run("hi", gpus=2, priority="high")],
            [
                busy("old", "p", "n1", ["0", "1"], priority="low", last_checkpoint_at=100.0),
                busy("fresh", "p", "n1", ["2", "3"], priority="low", last_checkpoint_at=990.0),
            ],
        ),
        admit={"hi": "n1"},
        devices={"hi": ("2", "3")},
        preempt={"fresh"},
    ),
    "fewest-victims-on-a-tie": Case(
        snap(
            N4,
            [PREEMPT_P],
            [run("hi", gpus=2, priority="high")],
            [
                busy("one", "p", "n1", ["0"], priority="low", last_checkpoint_at=0.0),
                busy("two", "p", "n1", ["1"], priority="low", last_checkpoint_at=0.0),
                busy("pair", "p", "n1", ["2", "3"], priority="low", last_checkpoint_at=500.0),
            ],
        ),
        admit={"hi": "n1"},
        preempt={"pair"},
    ),
    "victims-on-the-node-that-helps": Case(
        snap(
            [make_node("n1", 2), make_node("n2", 2)],
            [make_project("p", 4)],
            [run("hi", gpus=2, priority="high")],
            [
                busy("c1", "p", "n1", ["0"], priority="low", last_checkpoint_at=999.0),
                busy("x", "p", "n1", ["1"], priority="high"),
                busy("c2", "p", "n2", ["0", "1"], priority="low", last_checkpoint_at=900.0),
            ],
        ),
        admit={"hi": "n2"},
        preempt={"c2"},
    ),
    "a-victims-gpus-count-once-in-the-etas": Case(
        # lo's 8 GPUs go back now (hi takes 4, 4 are free): they are not also released at lo's
        # expected end (1,200), so 'next' (8 GPUs) waits for hi's end, not for lo's
        snap(
            [make_node("n1", 8)],
            [make_project("p", 16)],
            [
                run("hi", gpus=4, priority="high", max_runtime_s=100_000.0),
                run("next", gpus=8, seq=1),
            ],
            [
                busy(
                    "lo",
                    "p",
                    "n1",
                    [str(i) for i in range(8)],
                    priority="low",
                    max_runtime_s=1200.0,
                )
            ],
        ),
        admit={"hi": "n1"},
        preempt={"lo"},
        codes={"next": RC.NO_CAPACITY},
        eta={"next": 101_000.0},
    ),
    "a-run-being-preempted-holds-nothing": Case(
        snap(
            N4,
            [PREEMPT_P],
            [run("hi", gpus=4, priority="high")],
            [
                busy(
                    "lo",
                    "p",
                    "n1",
                    ["0", "1", "2", "3"],
                    priority="low",
                    preempt_requested=True,
                    grace_s=20.0,
                )
            ],
        ),
        # (its devices are free in the core: the controller waits for it to exit)
        admit={"hi": "n1"},
    ),
    "preemption-switched-off": Case(
        snap(
            N4,
            [PREEMPT_P],
            [run("hi", gpus=4, priority="high")],
            [busy("lo", "p", "n1", ["0", "1", "2", "3"], priority="low")],
            preemption=False,
        ),
        codes={"hi": RC.QUOTA},
    ),
    "las-preempts-higher-level-same-priority": Case(
        snap(
            N4,
            [make_project("p", 8)],
            [run("new", gpus=4)],
            [
                busy(
                    "hog",
                    "p",
                    "n1",
                    ["0", "1", "2", "3"],
                    attained_gpu_s=50_000.0,
                    last_checkpoint_at=900.0,
                )
            ],
            order="las",
        ),
        admit={"new": "n1"},
        preempt={"hog"},
    ),
    "las-spares-an-uncheckpointed-run-of-its-class": Case(
        snap(
            N4,
            [make_project("p", 8)],
            [run("new", gpus=4)],
            [busy("hog", "p", "n1", ["0", "1", "2", "3"], attained_gpu_s=50_000.0)],
            order="las",
        ),
        codes={"new": RC.NO_CAPACITY},
    ),
    "shortest-preempts-a-run-with-far-longer-to-go": Case(
        # started at 0, expected to run until 100,000: 99,000 s left at now=1,000 > 8 x 600
        quick_vs_long(100_000.0),
        admit={"quick": "n1"},
        devices={"quick": ALL4},
        preempt={"long"},
    ),
    "shortest-spares-an-uncheckpointed-run-of-its-class": Case(
        quick_vs_long(100_000.0, checkpoint=None),
        codes={"quick": RC.NO_CAPACITY},
    ),
    "shortest-takes-an-uncheckpointed-run-when-configured": Case(
        quick_vs_long(100_000.0, checkpoint=None, preempt_uncheckpointed=True),
        admit={"quick": "n1"},
        preempt={"long"},
    ),
    "shortest-spares-a-run-of-its-class-under-the-minimum-runtime": Case(
        # started at 500: 500 s run by now=1,000 < 600 (the default minimum)
        quick_vs_long(100_000.0, checkpoint=900.0, started=500.0),
        codes={"quick": RC.NO_CAPACITY},
    ),
    "shortest-minimum-runtime-is-configurable": Case(
        quick_vs_long(
            100_000.0, checkpoint=900.0, started=500.0, min_runtime_before_preemption_s=500.0
        ),
        admit={"quick": "n1"},
        preempt={"long"},
    ),
    "shortest-spares-a-run-of-its-class-without-max-runtime": Case(
        # its end is unknown: not taken as infinitely long
        quick_vs_long(None),
        codes={"quick": RC.NO_CAPACITY},
    ),
    "shortest-keeps-a-run-within-the-ratio": Case(
        # 4,000 s left: longer than the run, but not 8 x longer: no churn for a small gain
        quick_vs_long(5000.0),
        codes={"quick": RC.NO_CAPACITY},
    ),
    "shortest-ratio-1-is-plain-srtf": Case(
        quick_vs_long(5000.0, shortest_preempt_ratio=1.0),
        admit={"quick": "n1"},
        preempt={"long"},
    ),
    "shortest-no-swap-a-borrowing-run-for-its-own-runs-within-nominal": Case(
        # The gang would borrow (8 > nominal 4) once both victims are gone, while each victim,
        # requeued, fits within nominal and would be served first: they would trade places
        # every cycle. No preemption.
        snap(
            [make_node("n1", 4), make_node("n2", 4)],
            [make_project("p", 4, None, cohort=ORG), make_project("q", 4, None, cohort=ORG)],
            [run("gang", gpus=4, nodes=2, max_runtime_s=600.0)],
            [
                busy("a", "p", "n1", ["0", "1", "2", "3"], max_runtime_s=100_000.0),
                busy("b", "p", "n2", ["0", "1", "2", "3"], max_runtime_s=100_000.0),
            ],
            now=1000.0,
        ),
        codes={"gang": RC.QUOTA},
    ),
    "submit-order-never-preempts-its-own-class": Case(
        quick_vs_long(100_000.0, order="submit"),
        codes={"quick": RC.NO_CAPACITY},
    ),
    "gang-victims-span-nodes": Case(
        snap(
            [make_node("n1", 2), make_node("n2", 2)],
            [make_project("p", 4)],
            [run("g", gpus=2, nodes=2, priority="high")],
            [
                busy("v1", "p", "n1", ["0", "1"], priority="low"),
                busy("v2", "p", "n2", ["0", "1"], priority="low"),
            ],
        ),
        admit={"g": ("n1", "n2")},
        preempt={"v1", "v2"},
    ),
}

ALL = {
    **{f"4-{k}": v for k, v in PLACEMENT.items()},
    **{f"5-{k}": v for k, v in PREEMPTION.items()},
}


@pytest.mark.parametrize("case", ALL.values(), ids=ALL.keys())
def test_policy(case: Case) -> None:
    check(case)


def test_preemption_carries_signal_and_grace() -> None:
    from mlops_gpu.core import decide
    from mlops_gpu.model import CheckpointPolicy

    s = snap(
        N4,
        [PREEMPT_P],
        [run("hi", gpus=4, priority="high")],
        [
            busy(
                "lo",
                "p",
                "n1",
                ["0", "1", "2", "3"],
                priority="low",
                checkpoint=CheckpointPolicy("SIGUSR1", 45.0),
            )
        ],
    )
    (pre,) = decide(s).preemptions
    assert (pre.signal, pre.grace_s, pre.for_run) == ("SIGUSR1", 45.0, "hi")
    # 4 GPUs since its start at 0 (no checkpoint), at now=1,000
    assert pre.lost_gpu_s == 4000.0
    assert "preempted for run hi" in pre.reason


def test_gang_placement_on_two_nodes_uses_each() -> None:
    from mlops_gpu.core import decide

    s = snap([make_node("n1", 2), make_node("n2", 2)], [P], [run("g", gpus=1, nodes=2)])
    (adm,) = decide(s).admissions
    assert adm.placement == placed_gang([("n1", ["0"]), ("n2", ["0"])])
