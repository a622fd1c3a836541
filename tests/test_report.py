"""``mlops-gpu report``: runs, GPU-hours, cost, utilization, waits, preemptions and wasted
GPU-hours per project, user, GPU type and day, from the usage ledger, as JSON, CSV, a table and
a chart; a bad ``--since`` is one error line."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_cli

from mlops_gpu.config import load_config
from mlops_gpu.controller.usage_report import build_report
from mlops_gpu.model import Phase
from mlops_gpu.state import Store, UsageRow
from mlops_gpu.testing import make_spec
from mlops_gpu.testing.builders import placed

T0 = 1_000_000.0  # 1970-01-12 13:46:40 UTC


def ledger(cfg_path: Path) -> None:
    """Project p: alice's run waits 60 s, holds 2 GPUs for 1 h at 80% utilization; bob's run
    waits 120 s, holds 1 GPU for 30 min at 10%, idle for its last 20 min; carol's run in
    project q is preempted after 15 min on 1 GPU, requeued, and waits 30 s for its second
    attempt, which runs 15 min more."""
    store = Store(load_config(cfg_path).store_url)
    try:
        for user, gpus, wait, hours, util, idle in (
            ("alice", ["0", "1"], 60, 1.0, 80.0, 0.0),
            ("bob", ["2"], 120, 0.5, 10.0, 1200.0),
        ):
            run = store.submit(replace(make_spec("p", len(gpus)), user=user), now=T0)
            assert store.admit(run.id, placed("node-a", gpus), now=T0 + wait)
            store.set_handle(run.id, "h", Phase.RUNNING, now=T0 + wait)
            end = T0 + wait + hours * 3600
            assert store.finish(run.id, Phase.SUCCEEDED, "done", now=end, mean_util=util,
                                idle_s=idle)  # fmt: skip
        run = store.submit(replace(make_spec("q", 1), user="carol"), now=T0)
        assert store.admit(run.id, placed("node-a", ["3"]), now=T0)
        store.set_handle(run.id, "h", Phase.RUNNING, now=T0)
        assert store.requeue(run.id, "preempted", "make room", None, now=T0 + 900) is Phase.PENDING
        assert store.admit(run.id, placed("node-a", ["3"]), now=T0 + 930)
        store.set_handle(run.id, "h2", Phase.RUNNING, now=T0 + 930)
        assert store.finish(run.id, Phase.SUCCEEDED, "done", now=T0 + 1830)
    finally:
        store.close()


def test_report_json_by_project(cfg_path: Path) -> None:
    ledger(cfg_path)
    r = run_cli("--config", str(cfg_path), "report", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["by"] == "project" and out["since"] is None
    p, q = out["rows"]
    # a100-80gb costs $2.5 per GPU-hour: p holds 2 x 1 h + 1 x 0.5 h = 2.5 GPU-hours, $6.25
    assert (p["key"], p["runs"], p["attempts"], p["gpu_hours"], p["cost_usd"]) == (
        "p", 2, 2, 2.5, 6.25,
    )  # fmt: skip
    assert p["mean_utilization"] == pytest.approx((80 * 2 + 10 * 0.5) / 2.5)  # by GPU-hours
    assert (p["mean_wait_s"], p["p95_wait_s"]) == (90.0, pytest.approx(60 + 0.95 * 60))
    assert (p["preemptions"], p["wasted_gpu_hours"]) == (0, pytest.approx(1200 / 3600, abs=1e-6))
    # q: two attempts of one run, the first preempted; the second waited from its requeue
    assert (q["key"], q["runs"], q["attempts"], q["preemptions"]) == ("q", 1, 2, 1)
    assert (q["gpu_hours"], q["mean_wait_s"], q["mean_utilization"]) == (0.5, 15.0, None)
    t = out["total"]
    assert (t["runs"], t["attempts"], t["gpu_hours"], t["cost_usd"]) == (3, 4, 3.0, 7.5)
    assert t["wasted_gpu_hours"] == pytest.approx(1 / 3, abs=1e-6)


def test_report_by_user_gpu_type_and_csv(cfg_path: Path) -> None:
    ledger(cfg_path)
    r = run_cli("--config", str(cfg_path), "report", "--by", "user", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["user"], x["cost_usd"]) for x in rows] == [
        ("alice", "5.0"), ("bob", "1.25"), ("carol", "1.25"),
    ]  # fmt: skip
    assert rows[2]["mean_utilization"] == ""  # unknown, not zero
    by_type = json.loads(
        run_cli("--config", str(cfg_path), "report", "--by", "gpu_type", "--format", "json").stdout
    )
    assert [(x["key"], x["gpu_hours"]) for x in by_type["rows"]] == [("a100-80gb", 3.0)]


def test_by_day_splits_gpu_time_at_midnight_utc() -> None:
    day = 86400.0
    row = UsageRow("r1", 1, "p", "u", "a", "local", 2.0, 3 * day - 1800, 3 * day + 5400,
                   2.0 * 7200, "succeeded", queued_at=3 * day - 1900)  # fmt: skip
    out = build_report([row], {"a": 1.0}, None, "day")
    first, second = out["rows"]
    assert (first["key"], first["gpu_hours"], first["attempts"]) == ("1970-01-03", 1.0, 0)
    assert (second["key"], second["gpu_hours"], second["attempts"]) == ("1970-01-04", 3.0, 1)
    assert second["mean_wait_s"] == 100.0 and out["total"]["gpu_hours"] == 4.0
    with pytest.raises(ValueError, match="by must be one of"):
        build_report([row], {}, None, "team")


def test_report_table_plot_and_a_window_that_excludes_old_attempts(
    cfg_path: Path, tmp_path: Path
) -> None:
    ledger(cfg_path)
    png = tmp_path / "usage.png"
    table = run_cli("--config", str(cfg_path), "report", "--plot", str(png))
    assert table.returncode == 0, table.stderr
    assert "TOTAL" in table.stdout and "7.50" in table.stdout and "WASTED GPU-H" in table.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recent = run_cli("--config", str(cfg_path), "report", "--since", "1h", "--format", "json")
    out = json.loads(recent.stdout)  # the ledger is from 1970
    assert out["rows"] == [] and out["total"]["attempts"] == 0
    assert out["total"]["mean_wait_s"] is None


def test_report_names_a_bad_since_and_a_bad_plot_path(cfg_path: Path) -> None:
    r = run_cli("--config", str(cfg_path), "report", "--since", "soon")
    assert r.returncode == 2 and r.stderr.startswith("mlops-gpu: error: ") and "--since" in r.stderr
    r = run_cli("--config", str(cfg_path), "report", "--plot", "/nonexistent/dir/u.png")
    assert r.returncode != 0 and "--plot /nonexistent/dir/u.png" in r.stderr


def test_the_cli_and_the_report_agree_on_groupings() -> None:
    from mlops_gpu.cli import report
    from mlops_gpu.controller import usage_report

    assert report.BY == usage_report.BY


@pytest.mark.parametrize(
    "heights",
    [
        pytest.param([5.0, 1.0, 0.5], id="tallest-first"),
        pytest.param([0.2, 3.0, 9.0], id="tallest-last"),
        pytest.param([4.0], id="one-bar"),
        pytest.param([1.0] * 12, id="twelve-equal"),
    ],
)
def test_report_plot_legend_covers_no_bar(tmp_path: Path, heights: list[float]) -> None:
    """The legend of ``report --plot`` sat inside the axes, on top of the tallest bar."""
    from matplotlib.patches import Rectangle

    from mlops_gpu.cli.report import plot

    rows = [{"key": f"project-{i}", "gpu_hours": h, "wasted_gpu_hours": h / 4}
            for i, h in enumerate(heights)]  # fmt: skip
    out = {"by": "project", "rows": rows, "total": {"cost_usd": 12.5}}
    fig = plot(out, str(tmp_path / "u.png"))
    assert (tmp_path / "u.png").stat().st_size > 0
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # (the figure is closed: a canvas again)
    legends = [*fig.legends, *(a.get_legend() for a in fig.axes if a.get_legend())]
    assert legends
    boxes = [lg.get_window_extent(renderer) for lg in legends]
    ax = fig.axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    assert bars and labels
    for box in boxes:
        for item in [*bars, *labels]:
            assert not box.overlaps(item.get_window_extent(renderer)), item
