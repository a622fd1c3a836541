"""The one control loop and the wiring that joins config, store, backends and core.

Invariants:
- Only the controller turns decisions into effects: an admission is recorded in the store
  before its backend is asked to launch, and rolled back if the launch fails; so after a crash
  a run is never launched twice and its GPUs are never booked twice.
- On start-up (``Controller.reconcile``) the store is matched with what the backends report.
- One controller per store at a time (``LeaderLock``).
"""

from mlops_gpu.controller.loop import Controller
from mlops_gpu.controller.runtime import Runtime, SubmitError

__all__ = ["Controller", "Runtime", "SubmitError"]
