"""The earliest-start index a reservation reads (``State.earliest``, ``reach_index``) follows
every change that moves a node's time: devices taken and given back, runs starting and
ending, a run whose end starts moving with the clock once it is preempted, and a change log
cut short. Each case compares it with the walk over every node's timeline."""

from __future__ import annotations

import pytest

from mlops_gpu.core import capacity
from mlops_gpu.core.backfill import _earliest_by_backend, _timelines, reach_on
from mlops_gpu.core.state import State
from mlops_gpu.model import Phase
from mlops_gpu.testing import make_node, make_project, make_run, make_snapshot
from mlops_gpu.testing.builders import placed

T = "a100-80gb"


def _state() -> State:
    nodes = [make_node(f"n{i}", 4, T) for i in range(4)]
    active = [
        make_run(
            f"a{i}",
            "p",
            gpus=2 + i % 3,
            phase=Phase.RUNNING,
            placement=placed(f"n{i}", [str(d) for d in range(2 + i % 3)]),
            started_at=0.0,
            max_runtime_s=100.0 * (4 - i),
        )
        for i in range(4)
    ]
    snap = make_snapshot(nodes, [make_project("p", quotas={T: 16})], active=active, now=10.0)
    return State.from_snapshot(snap)


def _check(st: State, now: float, gpus: int, width: int = 1) -> list[tuple[float, str]]:
    snap = st.view(now)
    lines = _timelines(snap)

    def walk(node: str, free: int, need: int) -> tuple[int, float]:
        return reach_on(lines.get(node, []), free, need, now)

    probe = make_run("probe", "p", gpus=gpus, nodes=width)
    got = st.earliest(probe, T, now)
    assert got is not None
    walked = _earliest_by_backend(snap, st.cap, probe, T, walk)
    # (the walk also ranks the nodes that wait for runs of unknown end, after the others)
    want = [[(w, n) for k, w, n in g] for g in walked if not any(k for k, _, _ in g)]
    assert ([got] if len(got) >= width else []) == want
    return got


@pytest.mark.parametrize(
    "change",
    ["finish", "admit", "preempt", "trial-release", "log-cut"],
)
def test_index_follows_each_change(change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    st = _state()
    before = _check(st, 10.0, 4, 2)  # built
    assert [name for _, name in before] == ["n3", "n2"]  # the soonest to free 4 GPUs
    if change == "finish":
        st.finish("a2")
    elif change == "admit":
        st.add_pending(make_run("new", "p", gpus=2, max_runtime_s=5.0))
        st.admit("new", placed("n1", ["2", "3"]), 10.0)
    elif change == "preempt":  # its end now moves with the clock (its grace)
        st.mark_going("a0")
    elif change == "trial-release":  # a preemption trial: given back, then taken again
        run = st.active["a1"]
        assert run.placement is not None
        st.cap.release("p", run.placement)
        _check(st, 10.0, 4, 2)
        st.cap.take("p", run.placement)
    else:  # the log is cut short: the index is built again
        monkeypatch.setattr(capacity, "MAX_CHANGES", 1)
        st.finish("a3")
        st.finish("a2")
    for now in (10.0, 150.0, 500.0):
        for gpus, width in ((1, 1), (3, 1), (4, 1), (4, 2)):
            _check(st, now, gpus, width)
