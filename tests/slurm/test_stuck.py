"""``slurm_stuck``: which nodes are dead for a pinned job, and the record-then-cancel order that
keeps a stuck job from running twice or ending ``failed`` (pure: fake Slurm calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlops_gpu.backends.slurm_parse import SlurmJobInfo, SlurmNode
from mlops_gpu.backends.slurm_stuck import StuckJobs, dead_nodes


def node(name: str, *words: str, reason: str = "") -> SlurmNode:
    return SlurmNode(name, {"l4": 4}, False, reason, frozenset(words))


NODES = [
    node("down", "DOWN", "POWERED_DOWN", reason="down: ResumeTimeout reached"),
    node("drained", "IDLE", "DRAIN", reason="drain: admin"),
    node("powering-down", "IDLE", "DRAIN", "POWER_DOWN"),
    node("rebooting", "IDLE", "DRAIN", "REBOOT_REQUESTED"),
    node("booting", "IDLE", "POWERING_UP"),
    node("off", "IDLE", "POWERED_DOWN"),
    node("up", "IDLE"),
]


def test_dead_nodes_are_down_failed_or_drained_by_an_admin() -> None:
    assert dead_nodes(NODES) == {
        "down": "down: ResumeTimeout reached",
        "drained": "drain: admin",
    }


def pending(job: str, nodes: str, reason: str = "ReqNodeNotAvail") -> SlurmJobInfo:
    return SlurmJobInfo(job, f"mlops-gpu.r{job}.1", "PENDING", reason=reason, required=nodes)


QUEUE = {
    "1": pending("1", "down"),
    "2": pending("2", "up,drained"),
    "3": pending("3", "powering-down"),
    "4": pending("4", "down", reason="Resources"),
    "5": SlurmJobInfo("5", "mlops-gpu.r5.1", "RUNNING", required="down"),
}


def test_a_sweep_records_then_cancels_only_jobs_pinned_to_dead_nodes(tmp_path: Path) -> None:
    stuck = StuckJobs(tmp_path / "stuck.json")
    seen: list[list[str]] = []

    def scancel(jobs: list[str]) -> None:
        assert set(stuck.why({j: cancelled(j) for j in jobs})) == set(jobs)  # recorded first
        seen.append(jobs)

    got = stuck.sweep(QUEUE, lambda: NODES, lambda h: h.split(","), scancel)
    assert got == ["1", "2"] and seen == [["1", "2"]]
    why = stuck.why({"1": cancelled("1"), "2": cancelled("2"), "3": cancelled("3")})
    assert why == {
        "1": "could not start: its node down is unavailable (down: ResumeTimeout reached)",
        "2": "could not start: its node drained is unavailable (drain: admin)",
    }
    assert stuck.why({"1": QUEUE["1"]}) == {}  # still pending: not lost (yet)


def cancelled(job: str) -> SlurmJobInfo:
    return SlurmJobInfo(job, f"mlops-gpu.r{job}.1", "CANCELLED")


def test_a_failed_cancel_reports_nothing_and_the_next_sweep_tries_again(tmp_path: Path) -> None:
    stuck = StuckJobs(tmp_path / "stuck.json")

    def refused(jobs: list[str]) -> None:
        raise RuntimeError("scancel: slurmctld busy")

    assert stuck.sweep(QUEUE, lambda: NODES, lambda h: h.split(","), refused) == []
    tries: list[list[str]] = []
    assert stuck.sweep(QUEUE, lambda: NODES, lambda h: h.split(","), tries.append) == ["1", "2"]
    assert tries == [["1", "2"]]


def test_nodes_unreadable_leaves_the_jobs_alone(tmp_path: Path) -> None:
    stuck = StuckJobs(tmp_path / "stuck.json")

    def away() -> list[SlurmNode]:
        raise RuntimeError("sinfo: no answer")

    assert stuck.sweep(QUEUE, away, lambda h: [h], pytest.fail) == []
    assert not (tmp_path / "stuck.json").exists()


def test_a_host_list_that_cannot_be_read_leaves_the_jobs_alone(tmp_path: Path) -> None:
    stuck = StuckJobs(tmp_path / "stuck.json")

    def no_answer(hostlist: str) -> list[str]:
        raise RuntimeError("scontrol show hostnames: no answer in 30s")

    assert stuck.sweep(QUEUE, lambda: NODES, no_answer, pytest.fail) == []
    assert not (tmp_path / "stuck.json").exists()
