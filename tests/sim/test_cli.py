"""``mlops-gpu simulate`` end to end through the CLI: the JSON contract of issue 4 and its
errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mlops_gpu.cli.main import cli

KEYS = {
    "policy",
    "avg_jct_s",
    "p50_jct_s",
    "p99_jct_s",
    "avg_wait_s",
    "p99_wait_s",
    "avg_slowdown",
    "makespan_s",
    "utilization",
    "utilization_bound",
    "jain",
    "jain_windows",
    "quota_violations",
    "preemptions",
    "lost_gpu_hours",
    "decisions_per_s",
    "wall_s",
    "gap_closed",
}


def test_simulate_json_has_every_key_and_gap_closed() -> None:
    args = ["simulate", "--trace", "synthetic", "--days", "0.25", "--nodes", "4", "--json"]
    for p in ("default", "fifo-backfill", "srtf-oracle", "fifo"):
        args += ["--policy", p]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["nodes"] == 4 and out["gpus"] == 32 and out["jobs"] > 0
    assert [r["policy"] for r in out["results"]] == [
        "default",
        "fifo-backfill",
        "srtf-oracle",
        "fifo",
    ]
    for row in out["results"]:
        assert set(row) >= KEYS
        assert row["gap_closed"] is not None
    fifo = next(r for r in out["results"] if r["policy"] == "fifo")
    assert fifo["quota_violations"] is None  # no quotas: not counted


def test_simulate_names_an_unknown_policy() -> None:
    res = CliRunner().invoke(cli, ["simulate", "--trace", "synthetic", "--policy", "nope"])
    assert res.exit_code != 0
    assert "--policy nope: unknown" in res.output and "srtf-oracle" in res.output


def test_simulate_plot_writes_one_png_per_figure(tmp_path: Path) -> None:
    args = ["simulate", "--trace", "synthetic", "--days", "0.1", "--nodes", "4", "--json"]
    args += ["--policy", "default", "--policy", "fifo", "--plot", str(tmp_path / "plots")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["jct_cdf.png", "share_default.png", "share_fifo.png", "utilization.png"]
    for p in (tmp_path / "plots").iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_openb_runs_on_the_traces_own_nodes() -> None:
    args = ["simulate", "--trace", "openb", "--start", "140", "--days", "0.5", "--json"]
    args += ["--policy", "default", "--policy", "fifo-backfill"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert (out["nodes"], out["gpus"]) == (1213, 6212) and out["jobs"] > 0
    for row in out["results"]:
        assert set(row) >= KEYS and row["avg_jct_s"] > 0


def test_simulate_openb_rejects_a_date_as_start() -> None:
    res = CliRunner().invoke(cli, ["simulate", "--trace", "openb", "--start", "2017-10-09"])
    assert res.exit_code != 0 and "day number" in res.output


def test_simulate_engine_native_says_when_it_is_not_there(
    tmp_path: Path, without_native: None
) -> None:
    trace = tmp_path / "jobs.csv"
    rows = [f"{i * 60},{600 + i},{1 + i % 2},team-{i % 2}" for i in range(20)]
    trace.write_text("submit_time,duration_s,gpus,project\n" + "\n".join(rows) + "\n")
    args = ["simulate", "--trace", str(trace), "--nodes", "2", "--policy", "default", "--json"]
    res = CliRunner().invoke(cli, [*args, "--engine", "native"])
    assert res.exit_code != 0
    assert "the native engine is not installed" in res.output
    assert "cargo" in res.output
    res = CliRunner().invoke(cli, args)  # auto: the Python reference
    assert res.exit_code == 0, res.output
    assert "(reference engine)" in res.output
