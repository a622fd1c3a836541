"""From the usage ledger to fair-share history and budget spend, and budgets, MIG slices and
shared GPUs through the config, the controller and the local backend."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
import yaml

from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.controller.accounting import decayed, spent, usage_history
from mlops_gpu.model import Budget, GpuType, Phase
from mlops_gpu.state import UsageRow
from mlops_gpu.testing import config_yaml, make_project, make_run, make_spec
from mlops_gpu.testing.builders import placed

H = 3600.0


def row(
    project: str, start: float, end: float, gpus: float = 1.0, t: str = "a100-80gb"
) -> UsageRow:
    return UsageRow("r", 1, project, "u", t, "local", gpus, start, end, gpus * (end - start), "x")


@pytest.mark.parametrize(
    ("start", "end", "now", "expected"),
    [
        (0.0, H, H, H / math.log(2) * 0.5),  # the last half-life: 72% of an hour
        (0.0, H, 2 * H, H / math.log(2) * 0.25),  # an hour older: half of that
        (5.0, 5.0, 10.0, 0.0),  # empty interval
    ],
    ids=["last-half-life", "one-half-life-ago", "empty"],
)
def test_decay(start: float, end: float, now: float, expected: float) -> None:
    assert decayed(1.0, start, end, now, H) == pytest.approx(expected)


def test_history_sums_per_project_and_type() -> None:
    rows = [row("p", 0, H), row("p", 0, H, gpus=2), row("q", 0, H, t="h100-80gb")]
    got = usage_history(rows, H, H)
    one = H / math.log(2) * 0.5
    assert got == pytest.approx({("p", "a100-80gb"): 3 * one, ("q", "h100-80gb"): one})


def test_spent_clips_to_the_window_and_counts_running_attempts() -> None:
    projects = {
        "p": make_project("p", budget=Budget(window_s=10 * H, gpu_hours=100)),
        "q": make_project("q"),
    }
    prices = {"a100-80gb": GpuType("a100-80gb", 2.5)}
    now = 20 * H
    rows = [
        row("p", 0, 12 * H, gpus=2),  # only 2 of its hours fall in the window
        row("p", 15 * H, 16 * H),  # 1 GPU-hour
        row("q", 15 * H, 16 * H),
    ]  # q has no budget: not reported
    active = [
        make_run(
            "a",
            "p",
            gpus=4,
            phase=Phase.RUNNING,
            admitted_at=19 * H,
            placement=placed("n", ["0", "1", "2", "3"]),
        )
    ]
    got = spent(rows, active, now, projects, prices)
    assert set(got) == {"p"}
    hours, usd = got["p"]
    assert hours == pytest.approx(2 * 2 + 1 + 4 * 1)
    assert usd == pytest.approx(hours * 2.5)


def _runtime(tmp_path: Path, **extra: object) -> Runtime:
    p = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml(projects={"p": (4, 0), "q": (4, 0)}))
    for k, v in extra.items():
        cur = data
        *path, last = k.split(".")
        for part in path:
            cur = cur.setdefault(part, {})
        cur[last] = v
    p.write_text(yaml.safe_dump(data))
    return Runtime.load(p)


def _wait_done(rt: Runtime, ctl: Controller, run_id: str, timeout: float = 20) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ctl.tick()
        r = rt.store.get(run_id)
        if r is not None and r.phase in (Phase.SUCCEEDED, Phase.FAILED):
            return
        time.sleep(0.05)
    raise AssertionError("run did not finish")


def test_spent_budget_holds_the_projects_runs(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, **{"projects.p.budget": {"window_s": 3600.0, "gpu_hours": 0.0005}})
    ctl = Controller(rt)
    code = "import time; time.sleep(0.6)"
    first = rt.submit(make_spec("p", gpus=4, command=(sys.executable, "-c", code)))
    _wait_done(rt, ctl, first.id)  # 4 GPUs x 0.6 s = 0.00067 GPU-hours > the budget
    second = rt.submit(make_spec("p", command=(sys.executable, "-c", "pass")))
    other = rt.submit(make_spec("q", command=(sys.executable, "-c", "pass")))
    ctl.tick()
    r = rt.store.get(second.id)
    assert r is not None and r.phase is Phase.PENDING and r.reason_code == "budget"
    assert "GPU-hour budget per 1h" in (r.reason or "")
    o = rt.store.get(other.id)
    assert o is not None and o.phase is not Phase.PENDING


def test_mig_slice_and_shared_gpu_on_the_local_backend(tmp_path: Path) -> None:
    nodes = [
        {"name": "mig-node", "gpu_type": "a100-80gb", "mig": {"1g.10gb": ["MIG-a", "MIG-b"]}},
        {
            "name": "shared-node",
            "gpu_type": "a100-80gb",
            "gpus": 1,
            "shared": True,
            "gpu_memory_mb": 80000,
        },
    ]
    rt = _runtime(tmp_path, **{"backends.local.nodes": nodes})
    ctl = Controller(rt)
    show = (sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
    mig = rt.submit(make_spec("p", mig="1g.10gb", command=show))
    halves = [rt.submit(make_spec("q", gpu_fraction=0.5, command=show)) for _ in range(2)]
    for r in (mig, *halves):
        _wait_done(rt, ctl, r.id)

    def out(run_id: str) -> str:
        (f,) = [f for f in rt.backends["local"].log_files(run_id, 1) if f.name == "stdout.log"]
        return f.read_text().strip()

    assert out(mig.id) == "MIG-a"
    assert [out(h.id) for h in halves] == ["0", "0"]
    charged = {u.run_id: u.gpus for u in rt.store.usage()}
    assert charged[mig.id] == pytest.approx(1 / 7) and charged[halves[0].id] == 0.5
