"""The devices of the scheduled run this process belongs to, for leases nested in it.

A job of the scheduler (a run, a Prefect flow run through the ``mlops-gpu`` worker, or the
child process of a lease's ``call``) is started with ``MLOPS_GPU_RUN_ID`` and
``CUDA_VISIBLE_DEVICES`` set to the devices it holds. An ``mg.gpus`` lease taken inside it is
carved from those devices first (no new scheduled run: they are already held under the run's
quota), and only when too few of them are free does it queue for other GPUs.

Invariants: the pool is read from the environment when this module is first imported (before
any lease of this process could touch ``CUDA_VISIBLE_DEVICES``); a device is given to at most
one nested lease at a time; a carved lease gives its devices back when it ends.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence


class OwnPool:
    """The free devices of this process's own run (none outside a scheduled run)."""

    def __init__(self, env: dict[str, str] | os._Environ[str]) -> None:
        inside = bool(env.get("MLOPS_GPU_RUN_ID"))
        visible = env.get("CUDA_VISIBLE_DEVICES", "") if inside else ""
        self.devices: tuple[str, ...] = tuple(d.strip() for d in visible.split(",") if d.strip())
        self.gpu_type = env.get("MLOPS_GPU_GPU_TYPE") or None
        self._free = list(self.devices)
        self._lock = threading.Lock()

    def take(self, n: int, gpu_type: str | Sequence[str] | None) -> tuple[str, ...] | None:
        """``n`` free devices of the run, or None (too few free, or not of ``gpu_type``)."""
        if n < 1:
            return None
        if gpu_type is not None:
            types = (gpu_type,) if isinstance(gpu_type, str) else tuple(gpu_type)
            if types and self.gpu_type not in types:
                return None
        with self._lock:
            if len(self._free) < n:
                return None
            taken, self._free = tuple(self._free[:n]), self._free[n:]
        return taken

    def give(self, devices: Sequence[str]) -> None:
        with self._lock:
            back = set(devices) | set(self._free)
            self._free = [d for d in self.devices if d in back]  # the run's order


OWN = OwnPool(os.environ)
