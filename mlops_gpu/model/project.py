"""Tenants: projects with per-GPU-type quotas, grouped in cohorts that share unused quota.

A ``Quota`` is per project and GPU type: ``nominal`` GPUs guaranteed, up to ``borrowing_limit``
more borrowed from the cohort (``None`` = no limit beyond the cohort's idle quota), and at most
``lending_limit`` of its idle nominal lent out (``None`` = all of it). A GPU type a project has
no quota entry for is one it cannot use (nominal 0, borrowing limit 0), as in Kueue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Quota:
    nominal: int = 0
    borrowing_limit: int | None = 0
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    """A spending cap per rolling window: GPU-hours, US dollars, or both.

    When spent, the project's runs ``wait``, or run at priority class ``lower_to``."""

    window_s: float
    gpu_hours: float | None = None
    usd: float | None = None
    action: str = "wait"
    lower_to: str | None = None


_NO_QUOTAS: Mapping[str, Quota] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Project:
    name: str
    cohort: str | None = None
    weight: float = 1.0
    quotas: Mapping[str, Quota] = field(default_factory=lambda: _NO_QUOTAS)
    budget: Budget | None = None

    def quota(self, gpu_type: str) -> Quota:
        q = self.quotas.get(gpu_type)
        return q if q is not None else Quota(nominal=0, borrowing_limit=0)


@dataclass(frozen=True, slots=True)
class Cohort:
    name: str
    parent: str | None = None
