"""Run phases and the legal transitions between them.

``pending -> admitted -> starting -> running -> succeeded | failed | cancelled``; a preempted or
lost run goes back to ``pending`` as attempt + 1 (or to ``failed`` once its retries are spent).
A run is in exactly one phase at a time; the store changes phases only along ``TRANSITIONS``.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    PENDING = "pending"
    ADMITTED = "admitted"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


#: Phases whose runs hold GPUs (their placement counts against nodes and quotas).
ACTIVE_PHASES: frozenset[Phase] = frozenset({Phase.ADMITTED, Phase.STARTING, Phase.RUNNING})
TERMINAL_PHASES: frozenset[Phase] = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.ADMITTED, Phase.CANCELLED, Phase.FAILED}),
    # admitted -> pending: the launch failed and the admission is rolled back.
    Phase.ADMITTED: frozenset({Phase.STARTING, Phase.RUNNING, Phase.PENDING} | TERMINAL_PHASES),
    # starting/running -> pending: preempted or lost, requeued as the next attempt.
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.PENDING} | TERMINAL_PHASES),
    Phase.RUNNING: frozenset({Phase.PENDING} | TERMINAL_PHASES),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.CANCELLED: frozenset(),
}


def can_transition(src: Phase, dst: Phase) -> bool:
    return dst in TRANSITIONS[src]
