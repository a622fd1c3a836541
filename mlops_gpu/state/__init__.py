"""The state store: runs, their events and the usage ledger, in SQLite (default) or PostgreSQL.

Invariants:
- A run is in exactly one phase; every phase change is a compare-and-set on the current phase
  in one transaction together with its event row, so concurrent writers cannot lose or fork a run.
- Events are append-only. The usage ledger gets one row per finished attempt that held GPUs.
- Imports only ``mlops_gpu.model`` (and SQLAlchemy).
"""

from mlops_gpu.state.errors import ConflictError, LeadershipLost
from mlops_gpu.state.ledger import UsageRow
from mlops_gpu.state.lock import LeaderLock
from mlops_gpu.state.store import Event, Store, open_store

__all__ = [
    "ConflictError",
    "Event",
    "LeaderLock",
    "LeadershipLost",
    "Store",
    "UsageRow",
    "open_store",
]
