"""Slurm power saving as node pool states (``model.pool.NodeState``), read from ``sinfo --json``.

Slurm's power saving (``SuspendProgram``/``ResumeProgram``, ``State=CLOUD`` nodes) flags a node
``POWERED_DOWN`` (``idle~``), ``POWERING_UP`` (``#``), ``POWERING_DOWN`` (``%``) or asks for it
(``POWER_DOWN``); a cloud node keeps ``CLOUD`` while up. The mapping, first match wins:
- ``DOWN``, ``FAIL`` (a resume that timed out, a dead node): no state, the node
  is out of the pool until an admin resumes it;
- ``POWERING_UP``: ``booting`` (Slurm runs its jobs once it registers);
- ``POWERED_DOWN``, ``POWERING_DOWN``, ``POWER_DOWN``: ``powered_down`` (a job allocated it makes
  Slurm resume it, after ``SuspendTimeout`` if it is still going down);
- ``DRAIN``: ``draining``;
- otherwise ``up``.

Invariants: pure (no I/O); a node is power-managed when it is a ``CLOUD`` node or shows a power
flag; a node never seen so has no state (it is a static node, not a pool's).
"""

from __future__ import annotations

from collections.abc import Iterable

from mlops_gpu.model import NodeState

#: A node in any of these states is dead until an admin resumes it (a resume that timed out).
GONE = frozenset({"DOWN", "FAIL", "FAILING"})
_OFF = frozenset({"POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"})
#: Flags that show a node is under power saving.
POWER_FLAGS = frozenset({"CLOUD", "POWERING_UP"}) | _OFF


def power_state(words: Iterable[str]) -> NodeState | None:
    """The pool state of a node with Slurm state words ``words`` (base state and flags, upper
    case), or None where it has none (down, failed: not usable until an admin acts)."""
    w = frozenset(words)
    if w & GONE:
        return None
    if "POWERING_UP" in w:
        return NodeState.BOOTING
    if w & _OFF:
        return NodeState.POWERED_DOWN
    if "DRAIN" in w or "DRAINING" in w or "DRAINED" in w:
        return NodeState.DRAINING
    return NodeState.UP


def power_managed(words: Iterable[str]) -> bool:
    """Whether state words ``words`` show a node under Slurm's power saving."""
    return bool(frozenset(words) & POWER_FLAGS)
