"""``mlops-gpu server``: one scheduler for a team, reached over HTTP (REST under ``/api/v1``).

An edge like the CLI: it calls the same ``controller`` functions the CLI does and runs the
control loop beside the API (``controller.service.SchedulerThread``), never a second scheduler.

Invariants:
- Every ``/api/v1`` route needs an identity (``auth``): an API token, or a trusted proxy's
  header; without one the answer is 401. ``/livez`` and ``/readyz`` need none.
- A run's user is the identity that submitted it; a user field in a body is ignored.
- Runs of a project the identity has no role in are invisible: 404, as if they did not exist.
- Every mutating request leaves one ``audit`` row (``audit``), whatever its result.
- Every error is JSON ``{"error": {"code", "message", "field"}}`` and never a traceback
  (``errors``); bodies are bounded and identities rate-limited (``limits``).
"""

from mlops_gpu.server.app import create_app

__all__ = ["create_app"]
