"""The pure scheduling policy: ``decide(snapshot) -> Decision``.

Invariants (checked by property tests):
- No I/O, no clock, no randomness, no logging side effects: time comes in ``Snapshot.now``, and
  the same snapshot always yields the same decision.
- Imports only ``mlops_gpu.model``. No state between calls: the engines that drive the policy
  over time (the Python reference, the Rust engine's Python side, the job control gate) live in
  ``mlops_gpu.engines``, a layer above (import-linter's layers contract).
- A decision never puts a node over capacity, never puts a project over nominal + borrowing
  limit, and places a gang whole or not at all.
- Every pending run that is not admitted gets a reason code and a human sentence.
"""

from mlops_gpu.core.decision import Admission, Decision, PendingReason, Preemption, ReasonCode
from mlops_gpu.core.policy import POLICIES, decide
from mlops_gpu.core.snapshot import PolicySettings, Snapshot
from mlops_gpu.core.validate import request_problems

__all__ = [
    "POLICIES",
    "Admission",
    "Decision",
    "PendingReason",
    "PolicySettings",
    "Preemption",
    "ReasonCode",
    "Snapshot",
    "decide",
    "request_problems",
]
