"""Trace loaders: the generic CSV, Philly (vendored copy), synthetic; malformed rows name the
file, the line and the column."""

from __future__ import annotations

import gzip
import re
from datetime import date
from pathlib import Path

import pytest

from mlops_gpu.cli.simulate import DATA
from mlops_gpu.sim.trace import OTHER, TraceError, load_csv, load_philly, synthetic

HEADER = "submit_time,duration_s,gpus,project,gpu_type,nodes,priority\n"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_generic_csv_splits_large_requests_and_sorts(tmp_path: Path) -> None:
    p = write(tmp_path, HEADER + "30,100,16,b,,,\n0,50,4,a,h100,,high\n10,5,8,a,,4,\n")
    t = load_csv(p)
    assert [(j.submit_s, j.gpus, j.nodes, j.project) for j in t.jobs] == [
        (0.0, 4, 1, "a"),
        (10.0, 2, 4, "a"),
        (30.0, 8, 2, "b"),
    ]
    assert t.jobs[0].gpu_type == "h100" and t.jobs[0].priority == "high"


def test_iso_times_are_relative_to_the_earliest(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "submit_time,duration_s,gpus,project\n2024-01-01T01:00:00,1,1,a\n2024-01-01T00:00:00,1,1,b\n",
    )
    assert [j.submit_s for j in load_csv(p).jobs] == [0.0, 3600.0]


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("x,10,1,a,,,", ":2: column submit_time: expected seconds or an ISO 8601 time"),
        ("0,-5,1,a,,,", ":2: column duration_s: expected a number >= 0"),
        ("0,10,1.5,a,,,", ":2: column gpus: expected a whole number"),
        ("0,10,0,a,,,", ":2: column gpus: expected at least 1 GPU"),
        ("0,10,6,a,,4,", ":2: 6 GPUs do not split evenly over 4 node(s)"),
        ("0,10,1,,,,", ":2: column project: expected a name"),
    ],
    ids=[
        "bad-time",
        "negative-duration",
        "fractional-gpus",
        "zero-gpus",
        "uneven-split",
        "no-project",
    ],
)
def test_malformed_rows_name_file_line_and_column(tmp_path: Path, row: str, says: str) -> None:
    p = write(tmp_path, HEADER + row + "\n")
    with pytest.raises(TraceError) as e:
        load_csv(p)
    assert str(e.value).startswith(str(p)) and says in str(e.value)


def test_missing_columns_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r":1: header lacks column\(s\) duration_s, project"):
        load_csv(write(tmp_path, "submit_time,gpus\n0,1\n"))
    with pytest.raises(TraceError, match="no such trace file"):
        load_csv(tmp_path / "none.csv")
    with pytest.raises(TraceError, match="no jobs"):
        load_csv(write(tmp_path, "submit_time,duration_s,gpus,project\n"))


def test_philly_week_from_the_vendored_copy() -> None:
    t = load_philly(DATA / "philly.csv.gz", DATA / "philly_vc_nodes.csv", date(2017, 10, 9), 7)
    assert len(t.jobs) == 12751  # BENCHMARKS.md: the Philly week
    assert round(sum(j.gpu_seconds for j in t.jobs) / 3600) == 76447
    assert max(j.total_gpus for j in t.jobs) == 16
    assert {j.nodes for j in t.jobs if j.total_gpus == 16} == {2}
    assert (
        len(t.weights) == 11 and OTHER not in t.weights and t.weights["6214e9"] == 64
    )  # all 11 VCs
    assert all(0 <= j.submit_s < 7 * 86400 for j in t.jobs)


def test_philly_malformed_row(tmp_path: Path) -> None:
    vc = write(tmp_path, "vc,node num\na,8\n", "vc.csv")
    bad = tmp_path / "p.csv.gz"
    with gzip.open(bad, "wt") as f:
        f.write("timestamp,duration,num_gpus,gpu_time,cluster\n")
        f.write("2017-10-09 01:00:00,10,1,10,a\n2017-10-09 02:00:00,ten,1,10,a\n")
    with pytest.raises(TraceError, match=r"p.csv.gz:3: column duration: expected a number"):
        load_philly(bad, vc)


def test_synthetic_is_seeded() -> None:
    a, b, c = synthetic(seed=3, jobs=200), synthetic(seed=3, jobs=200), synthetic(seed=4, jobs=200)
    assert a.jobs == b.jobs and a.jobs != c.jobs
    assert len(a.jobs) == 200 and a.jobs == tuple(sorted(a.jobs, key=lambda j: j.submit_s))
    with pytest.raises(TraceError, match="--days: expected a number of days > 0"):
        synthetic(days=0)


def test_job_control_columns_drive_the_simulation(tmp_path: Path) -> None:
    """A pipeline with a %2 sweep: prep (100 s on 8 GPUs), then 4 sweep jobs of 500 s at most
    2 at once, then eval (50 s) after the whole sweep; a job after prep *fails* never runs."""
    from mlops_gpu.sim.simulator import Cluster, simulate

    p = tmp_path / "pipe.csv"
    p.write_text(
        "id,submit_time,duration_s,gpus,project,array_id,array_limit,dependencies\n"
        "prep,0,100,8,a,,,\n"
        + "".join(f"s{i},10,500,1,a,sweep,2,afterok:prep\n" for i in range(4))
        + "eval,20,50,1,a,,,afterok:sweep\n"
        "never,20,50,1,a,,,afternotok:prep\n"
    )
    trace = load_csv(p)
    by_id = {j.id: j for j in trace.jobs}
    assert by_id["s3"].array_id == "sweep" and by_id["s3"].array_limit == 2
    assert [d.run_id for d in by_id["eval"].dependencies] == ["s0", "s1", "s2", "s3"]
    for engine in ("reference", "python", "auto"):  # (python: the reference's former name)
        res = simulate(trace, Cluster(1, 8), "default", engine=engine)
        out = {o.job.id: o for o in res.outcomes}
        assert out["eval"].first_start == 100 + 500 + 500  # two waves of the %2 sweep
        starts = sorted(out[f"s{i}"].first_start or -1 for i in range(4))
        assert starts == [100, 100, 600, 600]
        assert out["never"].first_start is None and res.cancelled == 1 and res.unfinished == 0


@pytest.mark.parametrize(
    "rows,words",
    [
        ("a,0,1,1,p,,,afterok:b\nb,5,1,1,p,,,\n", "'b' is not a job or array that arrives"),
        ("a,0,1,1,p,,,afterok:nope\n", "'nope' is not a job or array"),
        ("a,0,1,1,p,,,soon:a\n", "expected KIND:ID"),
        ("a,0,1,1,p,,3,\n", "array_limit: set without an array_id"),
        ("a,0,1,1,p,x,2,\nb,0,1,2,p,x,2,\n", "array x: its jobs must ask for the same GPUs"),
    ],
    ids=["later-job", "unknown", "bad-kind", "limit-alone", "unequal-array"],
)
def test_job_control_columns_refuse_bad_rows(tmp_path: Path, rows: str, words: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("id,submit_time,duration_s,gpus,project,array_id,array_limit,dependencies\n"
                 + rows)  # fmt: skip
    with pytest.raises(TraceError, match=re.escape(words)):
        load_csv(p)
