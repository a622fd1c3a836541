"""Slurm jobs stuck pending on a dead node: found, cancelled, then reported ``lost``.

A job pinned (``--nodelist``) to a node that is down, failed or drained by an admin waits in
Slurm (``ReqNodeNotAvail``) until the node is back, and would start then, long after the
controller should have run the attempt elsewhere; it happens when a node dies between the
core's decision and the ``sbatch`` (a resume that times out does). ``StuckJobs.sweep`` finds
such jobs at a poll, records them in ``<shared_dir>/stuck.json``, and cancels them with
``scancel --state=PENDING``; a later poll that sees one CANCELLED reports it ``lost`` (the
controller requeues the run) instead of ``failed``.

Invariants:
- A job is reported lost only once Slurm says it is cancelled: a ``scancel`` that failed leaves
  it pending, to be found again at the next poll, and one that started meanwhile is not
  cancelled (``--state=PENDING``). So no run executes twice.
- The record is written before the cancel: a crash between them, or a poll that fails after
  it, still turns the CANCELLED job into ``lost``, not ``failed``.
- A node drained for a power-down or a reboot (Slurm lifts that drain itself) is not dead, and
  neither is one only powering up or down: jobs pinned to it wait.
- Records older than ``KEEP_S`` are dropped (Slurm forgets a job long before).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from mlops_gpu.backends.slurm_parse import SlurmJobInfo, SlurmNode
from mlops_gpu.backends.slurm_power import GONE

log = logging.getLogger("mlops_gpu.backends.slurm")

#: Why a pending job waits when a node it is pinned to cannot take it.
NODE_WAITS = frozenset({"ReqNodeNotAvail", "NodeDown"})
_DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})
#: Flags of a drain Slurm lifts by itself (a power-down or reboot asked "ASAP").
_PASSING = frozenset({"POWER_DOWN", "POWERING_DOWN", "POWER_DRAIN", "REBOOT_REQUESTED",
                      "REBOOT_ISSUED"})  # fmt: skip
KEEP_S = 7 * 86400.0


def dead_nodes(nodes: Iterable[SlurmNode]) -> dict[str, str]:
    """Nodes that will not run a job pinned to them until an admin acts (name -> why)."""
    return {
        n.name: n.reason or "down"
        for n in nodes
        if n.words & GONE or (n.words & _DRAINED and not n.words & _PASSING)
    }


class StuckJobs:
    """The record of jobs cancelled as stuck (``<shared_dir>/stuck.json``: id -> [when, why])."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> dict[str, tuple[float, str]]:
        try:
            data = json.loads(self.path.read_text())
            return {str(k): (float(v[0]), str(v[1])) for k, v in data.items()}
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            return {}

    def _save(self, rows: Mapping[str, tuple[float, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: list(v) for k, v in rows.items()}))
        os.replace(tmp, self.path)

    def why(self, queue: Mapping[str, SlurmJobInfo]) -> dict[str, str]:
        """The jobs of ``queue`` that ended CANCELLED because they were stuck (id -> why)."""
        cancelled = [j for j, i in queue.items() if i.state == "CANCELLED"]
        if not cancelled:
            return {}
        rows = self._load()
        return {j: rows[j][1] for j in cancelled if j in rows}

    def sweep(
        self,
        queue: Mapping[str, SlurmJobInfo],
        nodes: Callable[[], list[SlurmNode]],
        hostnames: Callable[[str], list[str]],
        scancel: Callable[[list[str]], object],
    ) -> list[str]:
        """Record and cancel the pending jobs of ``queue`` pinned to a dead node; the ids it
        asked Slurm to cancel (a later poll sees them CANCELLED). Errors of ``nodes`` or
        ``scancel`` (slurmctld away) are left to the next poll."""
        waiting = {j: i for j, i in queue.items()
                   if i.state == "PENDING" and i.reason in NODE_WAITS and i.required}  # fmt: skip
        if not waiting:
            return []
        found = {}
        try:
            dead = dead_nodes(nodes())
            for j, info in waiting.items():
                bad = [n for n in hostnames(info.required) if n in dead]
                if bad:
                    found[j] = f"could not start: its node {bad[0]} is unavailable ({dead[bad[0]]})"
        except Exception as e:  # (a SlurmError: the caller's transport)
            log.warning("cannot read the nodes of stuck jobs %s: %s", sorted(waiting), e)
            return []
        if not found:
            return []
        now = time.time()
        rows = {k: v for k, v in self._load().items() if now - v[0] < KEEP_S}
        rows.update({j: (now, why) for j, why in found.items()})
        self._save(rows)  # before the cancel: a crash after it still reads as lost
        try:
            scancel(sorted(found))
        except Exception as e:
            log.warning("cannot cancel stuck jobs %s (next poll retries): %s", sorted(found), e)
            return []
        return sorted(found)
