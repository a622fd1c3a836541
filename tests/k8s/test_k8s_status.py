"""Which Jobs a poll lists pods for, read from the Job alone (no cluster needed)."""

from __future__ import annotations

from typing import Any

import pytest

from mlops_gpu.backends.k8s import _needs_pods, _nodes, _ts
from mlops_gpu.backends.k8s_manifest import SCHEDULER_NAME


def job(*, deleting: bool = False, cond: str | None = None, gang: bool = False,
        ready: int = 0, parallelism: int = 1) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": "j", "annotations": {"mlops-gpu/nodes": "n1,n2"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T13:00:00Z"
    pod_spec = {"schedulerName": SCHEDULER_NAME} if gang else {"nodeName": "n1"}
    status: dict[str, Any] = {"ready": ready}
    if cond:
        status["conditions"] = [{"type": cond, "status": "True"}]
    return {"metadata": meta, "spec": {"parallelism": parallelism,
            "template": {"spec": pod_spec}}, "status": status}  # fmt: skip


@pytest.mark.parametrize(
    ("j", "want"),
    [
        (job(), False),
        (job(ready=1), False),
        (job(deleting=True, ready=1), True),
        (job(cond="Complete"), False),
        (job(cond="Failed"), True),
        (job(gang=True, parallelism=2, ready=1), True),
        (job(gang=True, parallelism=2, ready=2), False),
        (job(gang=True, parallelism=2, cond="Complete"), False),
    ],
    ids=[
        "starting",
        "running",
        "being-stopped",
        "complete",
        "failed-exit-code",
        "gang-to-bind",
        "gang-running",
        "gang-complete",
    ],
)
def test_pods_are_listed_only_for_jobs_that_need_them(j: dict[str, Any], want: bool) -> None:
    assert _needs_pods(j) is want


def test_placement_nodes_and_api_times() -> None:
    assert _nodes(job()) == ["n1", "n2"]
    assert _nodes({"metadata": {}}) == []
    assert _ts("1970-01-01T00:01:40Z") == 100.0
    assert _ts(None) is None


class _NoApi:
    """Any API call fails the test: what is asserted must come from memory."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected API call {name}")


class _EmptyCache:
    def jobs(self) -> dict[str, Any]:
        return {}


def test_a_job_created_a_moment_ago_is_starting_without_a_read() -> None:
    """Under load the watch event of a new Job comes seconds late: within the grace, a poll
    says starting instead of reading each such Job (or calling it lost)."""
    import time

    from mlops_gpu.backends.base import JobState
    from mlops_gpu.backends.k8s import KubernetesBackend

    b = KubernetesBackend("k8s", context="ctx", inventory_s=3600)
    b._api = (_NoApi(), _NoApi(), _NoApi())
    b._cache = _EmptyCache()  # type: ignore[assignment]
    b._inventory_at = time.monotonic()  # the inventory is fresh: no node list either
    b._created["mlops-gpu-r1-1"] = time.monotonic()
    handle = "k8s:ctx:default:mlops-gpu-r1-1"
    assert b.poll([handle])[handle].state is JobState.STARTING
    b._created["mlops-gpu-r1-1"] -= 3600  # long ago: now it is read directly
    with pytest.raises(AssertionError, match="unexpected API call read_namespaced_job"):
        b.poll([handle])
