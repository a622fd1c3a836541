"""Placement targets behind one small interface (``Backend``): capabilities, inventory, launch,
poll many, cancel, find.

Invariants:
- A backend never decides where a run goes: it runs exactly the placement the core chose.
- Handles are self-describing strings (``<kind>:...``) and a backend checks a handle is its own
  (and still names the same job) before it signals anything.
- Heavy SDKs (kubernetes, ...) are imported inside the backend that needs them, never here.
- Imports only ``mlops_gpu.model``.
"""

from mlops_gpu.backends.base import (
    Backend,
    HandleError,
    JobState,
    JobStatus,
    JobTelemetry,
    LaunchError,
    LauncherSettings,
    LaunchRequest,
    warm,
)

__all__ = [
    "Backend",
    "HandleError",
    "JobState",
    "JobStatus",
    "JobTelemetry",
    "LaunchError",
    "LaunchRequest",
    "LauncherSettings",
    "warm",
]
