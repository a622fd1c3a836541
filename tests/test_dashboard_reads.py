"""The dashboard's store reads, on SQLite and a real PostgreSQL: the queue read a page at a time
is the queue in ``queue`` order (filters included), and the Costs and Runs pages' aggregates
(GPU time per project per UTC day, MLflow run ids and lost work per run) sum what the store
holds."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from mlops_gpu.config import load_config
from mlops_gpu.controller import Runtime
from mlops_gpu.controller.views import queue_runs
from mlops_gpu.state.dashboard_reads import DAY_S, daily_usage, run_notes
from mlops_gpu.state.mlflow_notes import MlflowNote
from mlops_gpu.state.queue_page import pending_counts, pending_slice
from mlops_gpu.state.schema import events, usage
from mlops_gpu.testing import config_yaml, make_spec


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Runtime:
    data = yaml.safe_load(config_yaml(projects={"a": (4, 0), "b": (4, 0), "c": (4, 0)}))
    data["store"] = store_url
    data["mlflow"] = {"enabled": False}
    (tmp_path / "mlops-gpu.yaml").write_text(yaml.safe_dump(data))
    return Runtime(load_config(tmp_path / "mlops-gpu.yaml"))


def paged(rt: Runtime, size: int, **filters: object) -> list[str]:
    projects = filters.get("projects")
    user = filters.get("user")
    code = filters.get("reason_code")
    counts = pending_counts(rt.store, projects, user)  # type: ignore[arg-type]
    per_class: dict[str, int] = {}
    for (cls, c), n in counts.items():
        if code is None or (c or "") == code:
            per_class[cls] = per_class.get(cls, 0) + n
    out: list[str] = []
    offset = 0
    while True:
        page = pending_slice(rt.store, per_class, rt.cfg.priority_classes, offset=offset,
                             limit=size, **filters)  # type: ignore[arg-type]  # fmt: skip
        out += [r.id for r in page]
        if len(page) < size:
            return out
        offset += size


def test_the_queue_page_by_page_is_the_queue_in_order(rt: Runtime) -> None:
    rng = random.Random(3)
    classes = list(rt.cfg.priority_classes)
    specs = [
        replace(
            make_spec(rng.choice("abc"), 1, name=f"j{i}", priority=rng.choice(classes)),
            user=rng.choice(["ann", "bob"]),
        )
        for i in range(137)
    ]
    runs = [rt.store.submit(s, now=1000.0 + rng.randrange(40)) for s in specs]  # ties in time
    codes = {r.id: rng.choice(["quota", "capacity", None]) for r in runs}
    rt.store.set_reasons([(rid, c, f"waits for {c}", None) for rid, c in codes.items() if c])
    everything = [r.id for r in queue_runs(rt)]
    assert len(everything) == 137
    for size in (1, 50, 500):
        assert paged(rt, size) == everything
    counts = pending_counts(rt.store)
    assert sum(counts.values()) == 137
    assert sum(n for (_cls, c), n in counts.items() if c is None) == sum(
        1 for c in codes.values() if c is None
    )
    by = {r.id: r for r in queue_runs(rt)}
    want = [i for i in everything if by[i].project in ("a", "c") and by[i].spec.user == "bob"]
    assert paged(rt, 7, projects={"a", "c"}, user="bob") == want
    want = [i for i in everything if codes[i] == "quota"]
    assert paged(rt, 9, reason_code="quota") == want
    want = [i for i in everything if codes[i] is None]
    assert paged(rt, 9, reason_code="") == want  # "": not explained yet
    assert paged(rt, 9, projects=set()) == []


def test_costs_by_day_and_run_notes_sum_the_store(rt: Runtime) -> None:
    day = 20_000 * DAY_S
    rows = [  # (project, type, end, gpu_seconds, gpus, idle_s)
        ("a", "a100-80gb", day + 10, 3600.0, 1.0, 0.0),
        ("a", "a100-80gb", day + 20, 7200.0, 2.0, 600.0),
        ("a", "a100-80gb", day + DAY_S + 5, 1800.0, 1.0, 60.0),
        ("b", "a100-80gb", day + 30, 900.0, 0.5, 100.0),
        ("b", "a100-80gb", day - 5, 999.0, 1.0, 0.0),  # before the window
    ]
    with rt.store.engine.begin() as conn:
        conn.execute(usage.insert(), [
            {"run_id": f"x{i}", "attempt": 1, "project": p, "user": "u", "gpu_type": t,
             "backend": "local", "gpus": g, "start": end - gs / g, "end": end,
             "gpu_seconds": gs, "outcome": "succeeded", "idle_s": idle}
            for i, (p, t, end, gs, g, idle) in enumerate(rows)
        ])  # fmt: skip
        # (one statement: every row names the same columns)
        noted = [("r1", 1, "preempting", "", 1800.0), ("r1", 2, "preempting", "", 600.0),
                 ("r2", 1, "admitted", "", None)]  # fmt: skip
        conn.execute(events.insert(), [
            {"run_id": r, "time": float(i), "kind": k, "attempt": a, "reason": why,
             "lost_gpu_s": lost}
            for i, (r, a, k, why, lost) in enumerate(noted)
        ])  # fmt: skip
    rt.store.note_mlflow([
        MlflowNote("r1", 1, "opened", "m-old"), MlflowNote("r1", 2, "opened", "m-new"),
        MlflowNote("r3", 1, "opened", None),  # launched before its MLflow run was made
        MlflowNote("r4", 1, "opened", "m-first"), MlflowNote("r4", 2, "opened", None),
    ])  # fmt: skip
    got = {(d.project, d.day): d for d in daily_usage(rt.store, day)}
    assert set(got) == {("a", day), ("a", day + DAY_S), ("b", day)}
    a0 = got[("a", day)]
    assert (a0.attempts, a0.gpu_s, a0.idle_gpu_s) == (2, 10_800.0, 1200.0)
    assert got[("b", day)].idle_gpu_s == 50.0
    assert [d.project for d in daily_usage(rt.store, day, {"b"})] == ["b"]
    notes = run_notes(rt.store, ["r1", "r2", "r3", "r4"])
    assert set(notes) == {"r1", "r4"}  # r2, r3 have neither an MLflow run nor a preemption
    assert notes["r1"].mlflow_run_id == "m-new"
    assert notes["r4"].mlflow_run_id == "m-first"  # (its second attempt's not made yet)
    assert notes["r4"].preemptions == 0
    assert (notes["r1"].lost_gpu_s, notes["r1"].preemptions) == (2400.0, 2)
