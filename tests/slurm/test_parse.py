"""Reading Slurm 22.05's answers, from output captured on the repo's test cluster
(``data/``): a running job, one that exited 3, one cancelled; a drained node."""

from __future__ import annotations

import json
from pathlib import Path

from mlops_gpu.backends import JobState
from mlops_gpu.backends.slurm_parse import (
    expand_hostlist,
    gpu_gres,
    parse_sacct,
    parse_scontrol_job,
    parse_sinfo,
    parse_squeue,
)
from mlops_gpu.backends.slurm_stuck import NODE_WAITS

DATA = Path(__file__).with_name("data")


def test_squeue_jobs_states_and_exit_codes() -> None:
    doc = json.loads((DATA / "squeue-22.05.json").read_text())
    jobs = parse_squeue(doc)
    assert {j: (x.name, x.state, x.ours) for j, x in jobs.items()} == {
        "49": ("mlops-gpu.rabc.1", "RUNNING", JobState.RUNNING),
        "50": ("mlops-gpu.rdef.2", "FAILED", JobState.FAILED),
        "51": ("other", "CANCELLED", JobState.FAILED),
    }
    # 22.05's exit_code is the wait status: 768 is exit 3, 15 is SIGTERM
    assert (jobs["50"].exit_code, jobs["50"].signal) == (3, None)
    assert (jobs["51"].exit_code, jobs["51"].signal) == (None, 15)
    assert jobs["49"].start and jobs["49"].nodes == "sn1"
    assert set(parse_squeue(doc, ["50", "7"])) == {"50"}  # filtered here, not by squeue


def test_newer_exit_code_structs() -> None:
    doc = {"jobs": [{"job_id": 1, "name": "n", "job_state": ["COMPLETED"],
                     "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True,
                                   "infinite": False, "number": 0}}}]}  # fmt: skip
    (job,) = parse_squeue(doc).values()
    assert (job.state, job.exit_code, job.ours) == ("COMPLETED", 0, JobState.SUCCEEDED)


def test_a_pending_job_says_why_it_waits_and_where_it_is_pinned() -> None:
    # as squeue printed it for a job pinned to a node whose resume timed out
    doc = {"jobs": [{"job_id": 21, "name": "mlops-gpu.r5a.2", "job_state": "PENDING",
                     "state_reason": "ReqNodeNotAvail", "required_nodes": "sc1",
                     "state_description": "ReqNodeNotAvail, UnavailableNodes:sc1"}]}  # fmt: skip
    (job,) = parse_squeue(doc).values()
    assert (job.ours, job.reason, job.required, job.nodes) == (
        JobState.STARTING,
        "ReqNodeNotAvail",
        "sc1",
        "",
    )
    assert job.reason in NODE_WAITS


def test_sinfo_nodes_gres_and_drain() -> None:
    nodes = {n.name: n for n in parse_sinfo(json.loads((DATA / "sinfo-22.05.json").read_text()))}
    assert {k: v.gres for k, v in nodes.items()} == {
        "sn1": {"a100": 8}, "sn2": {"a100": 8}, "sn3": {"h100": 8}, "sn4": {"h100": 8},
    }  # fmt: skip
    assert nodes["sn1"].schedulable and not nodes["sn4"].schedulable
    assert nodes["sn4"].reason == "drain: disk full"


def test_gres_strings() -> None:
    assert gpu_gres("gpu:a100:8(S:0-1),tmpdisk:100") == {"a100": 8}
    assert gpu_gres("gpu:4") == {"": 4} and gpu_gres("(null)") == {} and gpu_gres("") == {}


def test_scontrol_and_sacct_records() -> None:
    info = parse_scontrol_job((DATA / "scontrol-show-job-failed.txt").read_text())
    assert info is not None
    assert (info.job_id, info.name, info.state, info.exit_code) == ("50", "mlops-gpu.rdef.2",
                                                                    "FAILED", 3)  # fmt: skip
    assert parse_scontrol_job("slurm_load_jobs error: Invalid job id specified") is None
    rows = parse_sacct(
        "50|mlops-gpu.rdef.2|FAILED|3:0|2026-11-30T10:25:15|2026-11-30T10:25:15|sn3\n"
        "51|other|CANCELLED by 0|0:15|2026-11-30T10:25:15|2026-11-30T10:25:17|sn1\n"
    )
    assert (rows["50"].exit_code, rows["50"].ours) == (3, JobState.FAILED)
    assert rows["51"].end is not None and rows["51"].end - (rows["51"].start or 0) == 2
    assert (rows["51"].state, rows["51"].signal) == ("CANCELLED", 15)


def test_host_lists() -> None:
    assert expand_hostlist("sc1") == ["sc1"]
    assert expand_hostlist("sc[1-3,5],sn2") == ["sc1", "sc2", "sc3", "sc5", "sn2"]
    assert expand_hostlist("gpu[08-10]x") == ["gpu08x", "gpu09x", "gpu10x"]
    assert expand_hostlist("a[1-2]b[3-4]") is None  # scontrol's to expand
    assert expand_hostlist("") == []
