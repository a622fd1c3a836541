"""Quota accounting: nominal quota, borrowing and lending limits, cohorts that share idle quota.

Model (per GPU type): a project may hold up to ``nominal`` on its own. Beyond that it borrows,
up to ``borrowing_limit`` (None = no limit), from the idle quota of the other projects in the
same cohort tree (the tree's root groups everyone who shares). A project lends at most
``lending_limit`` (None = all) of its idle nominal. The tree is consistent when

    sum over members of borrowed  <=  sum over members of lendable idle nominal,

with borrowed = max(used - nominal, 0) and lendable = min(max(nominal - used, 0), lending).
``admits`` checks both limits for an added amount. A project without a cohort has no one to
borrow from. Borrowed GPUs are reclaimable: a member within its nominal may preempt borrowers.
So only a preemptible run may borrow (``admits(..., preemptible=False)`` holds a run to its
project's nominal quota): a loan must be one its lender can take back.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from mlops_gpu.core import reason_text
from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.model import Quota

_EPS = 1e-9


def cohort_roots(snap: Snapshot) -> dict[str, str | None]:
    """project -> the root of its cohort tree (None: no cohort)."""
    out: dict[str, str | None] = {}
    for p in snap.projects.values():
        c = p.cohort
        seen = set()
        while c is not None and c in snap.cohorts and snap.cohorts[c].parent is not None:
            if c in seen:  # a loop the config check would have caught; stop anyway
                break
            seen.add(c)
            c = snap.cohorts[c].parent
        out[p.name] = c
    return out


class QuotaBook:
    def __init__(self, snap: Snapshot, used: Mapping[tuple[str, str], float]) -> None:
        self.projects = snap.projects
        self.used = used  # shared with Capacity: it changes as the cycle admits
        self.root = cohort_roots(snap)
        self.members: dict[str, list[str]] = defaultdict(list)
        for name, root in self.root.items():
            if root is not None:
                self.members[root].append(name)
        self._quotas: dict[tuple[str, str], Quota] = {}
        #: (root, type) -> each member's (name, nominal, lending limit), in member order
        self._terms: dict[tuple[str, str], list[tuple[str, float, int | None]]] = {}

    def quota(self, project: str, gpu_type: str) -> Quota:
        key = (project, gpu_type)
        q = self._quotas.get(key)
        if q is None:  # projects are immutable: look each (project, type) up once
            q = self._quotas[key] = self.projects[project].quota(gpu_type)
        return q

    def borrowed(self, project: str, gpu_type: str) -> float:
        return max(self.used[(project, gpu_type)] - self.quota(project, gpu_type).nominal, 0.0)

    def lendable(self, project: str, gpu_type: str, used: float) -> float:
        q = self.quota(project, gpu_type)
        idle = max(q.nominal - used, 0.0)
        return idle if q.lending_limit is None else min(idle, float(q.lending_limit))

    def admits(self, project: str, gpu_type: str, amount: float, preemptible: bool = True) -> bool:
        """Whether ``project`` may add ``amount`` of ``gpu_type`` now for a run that is
        ``preemptible`` (or not: then only within nominal): ``problem`` is None (without
        building its sentence, for the many checks that only need the answer)."""
        q = self.quota(project, gpu_type)
        after = self.used[(project, gpu_type)] + amount
        if after <= q.nominal + _EPS:
            return True
        if not preemptible:
            return False
        if q.borrowing_limit is not None and after > q.nominal + q.borrowing_limit + _EPS:
            return False
        root = self.root.get(project)
        if root is None:
            return False
        borrowed, lendable = self.cohort_sums(root, gpu_type, project, amount)
        return borrowed <= lendable + _EPS

    def problem(
        self, project: str, gpu_type: str, amount: float, preemptible: bool = True
    ) -> str | None:
        """None if ``project`` may add ``amount`` of ``gpu_type`` now (for a run that is
        ``preemptible`` or not, as ``admits``), else why not."""
        if self.admits(project, gpu_type, amount, preemptible):
            return None
        q = self.quota(project, gpu_type)
        used = self.used[(project, gpu_type)]
        root = self.root.get(project)
        if q.borrowing_limit is not None and used + amount > q.nominal + q.borrowing_limit + _EPS:
            kind = "limit"
        elif root is None:
            kind = "alone"
        elif not preemptible:
            kind = "nominal"
        else:
            kind = "cohort"
        idle = self.lendable_now(project, gpu_type) if kind == "cohort" else 0.0
        return reason_text.quota_problem(kind, project, gpu_type, q, used, amount, root, idle)

    def lendable_now(self, project: str, gpu_type: str) -> float:
        """Idle quota the others in the project's cohort tree could still lend: their lendable
        idle nominal minus what the tree's members borrow already."""
        root = self.root.get(project)
        if root is None:
            return 0.0
        borrowed, lendable = self.cohort_sums(root, gpu_type, project, 0.0, lend_of_project=False)
        return max(lendable - borrowed, 0.0)

    def cohort_sums(
        self,
        root: str,
        gpu_type: str,
        project: str | None = None,
        amount: float = 0.0,
        lend_of_project: bool = True,
    ) -> tuple[float, float]:
        """(borrowed, lendable) summed over the tree's members in member order, ``project``
        holding ``amount`` more; its own lendable left out unless ``lend_of_project``. The
        quota terms are read once per (root, type): this runs for most quota checks."""
        key = (root, gpu_type)
        terms = self._terms.get(key)
        if terms is None:
            terms = self._terms[key] = [
                (m, q.nominal, q.lending_limit)
                for m in self.members[root]
                for q in (self.quota(m, gpu_type),)
            ]
        used = self.used
        borrowed = lendable = 0.0
        for m, nominal, lending in terms:
            u = used[(m, gpu_type)] + (amount if m == project else 0.0)
            borrowed += max(u - nominal, 0.0)
            if lend_of_project or m != project:
                idle = max(nominal - u, 0.0)  # (as ``lendable``)
                lendable += idle if lending is None else min(idle, float(lending))
        return borrowed, lendable

    def within_nominal(self, project: str, gpu_type: str, amount: float) -> bool:
        nominal = self.quota(project, gpu_type).nominal
        return self.used[(project, gpu_type)] + amount <= nominal + _EPS

    def borrowers(self, project: str, gpu_type: str) -> dict[str, float]:
        """Other projects of the same cohort tree borrowing ``gpu_type`` now, with amounts."""
        root = self.root.get(project)
        if root is None:
            return {}
        out = {}
        for m in self.members[root]:
            b = self.borrowed(m, gpu_type)
            if m != project and b > _EPS:
                out[m] = b
        return out
