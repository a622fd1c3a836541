"""Trace-driven simulation: the real scheduling core on a virtual clock with a fake backend.

``load_philly`` / ``load_csv`` / ``synthetic`` make a ``Trace``; ``simulate(trace, Cluster(...),
policy)`` replays it under a named policy (``PRESETS``); ``summarize`` turns the result into the
metrics of BENCHMARKS.md. Nothing here copies the policy: presets are switches of the one core.
"""

from mlops_gpu.sim.metrics import gap_closed, summarize
from mlops_gpu.sim.policies import PRESETS
from mlops_gpu.sim.simulator import Cluster, SimResult, simulate
from mlops_gpu.sim.trace import Trace, TraceError, TraceJob, load_csv, load_philly, synthetic

__all__ = [
    "PRESETS",
    "Cluster",
    "SimResult",
    "Trace",
    "TraceError",
    "TraceJob",
    "gap_closed",
    "load_csv",
    "load_philly",
    "simulate",
    "summarize",
    "synthetic",
]
