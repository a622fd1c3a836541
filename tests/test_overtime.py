"""``lifecycle.ended_overdue``: a run that ended at or after its max runtime ended for it,
whatever its exit status; without the backend's end time only a failure seen late counts."""

from __future__ import annotations

from dataclasses import replace

from mlops_gpu.model.lifecycle import ended_overdue, overdue
from mlops_gpu.testing import make_run

RUN = replace(make_run("r", max_runtime_s=10.0), started_at=100.0)


def test_an_exit_0_at_or_after_the_limit_is_overdue() -> None:
    assert ended_overdue(RUN, True, 110.0, now=500.0)
    assert ended_overdue(RUN, False, 115.0, now=500.0)


def test_an_exit_before_the_limit_seen_late_is_not() -> None:
    assert not ended_overdue(RUN, True, 109.0, now=500.0)
    assert not ended_overdue(RUN, True, None, now=500.0)  # end time unknown: exit 0 trusted
    assert ended_overdue(RUN, False, None, now=500.0)
    assert not ended_overdue(RUN, False, None, now=105.0)


def test_no_limit_or_no_start_is_never_overdue() -> None:
    assert not ended_overdue(make_run("x"), False, 1e9, now=1e9)
    assert not overdue(replace(RUN, started_at=None), 1e9)
    assert not overdue(RUN, None)
