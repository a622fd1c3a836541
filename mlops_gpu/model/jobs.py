"""Slurm-like job control carried by a run spec: dependencies on other runs, arrays, begin time.

Invariants:
- A ``Dependency`` names one run by id; ``kind`` is one of ``DEPENDENCY_KINDS``. A dependency on
  a whole array or on a name is expanded to its runs' ids at submit, so the core only ever sees
  run ids.
- ``afterany`` waits for the run to end in any way; ``afterok`` for it to succeed (it can never
  be met once the run failed or was cancelled); ``afternotok`` for it to fail or be cancelled
  (never met once it succeeded).
- The elements of one array share ``array_id``, have distinct ``array_index`` values and
  identical requests; ``array_limit`` (``%N``) is the same on every element (None: no limit).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The dependency kinds, in the words of Slurm's ``--dependency`` (``--after`` is ``afterany``).
DEPENDENCY_KINDS = ("afterany", "afterok", "afternotok")


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: str
    run_id: str

    def to_text(self) -> str:
        return f"{self.kind}:{self.run_id}"

    @staticmethod
    def from_text(text: str) -> Dependency:
        kind, _, run_id = text.partition(":")
        if kind not in DEPENDENCY_KINDS or not run_id:
            raise ValueError(f"dependency: expected KIND:RUN_ID with KIND one of "
                             f"{', '.join(DEPENDENCY_KINDS)}, got {text!r}")  # fmt: skip
        return Dependency(kind, run_id)
