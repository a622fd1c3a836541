"""``mg.gpus(...)``: GPUs of the local backend held by the calling process for a ``with`` block,
under the same quotas, priorities and fair share as every run.

The lease is a scheduled run whose job only waits (``mlops_gpu.sdk.hold``): it is queued, and
once admitted on a local backend its devices are the caller's. ``mg.current_gpus()`` gives
them in the holding thread or task; ``CUDA_VISIBLE_DEVICES`` (one per process) is set for the
block when it is the process's only lease, and restored after. Leaving the block cancels the
run (its GPUs are free when ``__exit__`` returns, or after ``release_timeout``).

Invariants:
- A lease never outlives its holder: the job watches the caller's pid and ends when the caller
  does, so a crashed or killed caller does not keep GPUs.
- Leases are not preemptible (the scheduler cannot take GPUs back from code it does not run).
- Only local backends: the devices must be on the caller's host.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from mlops_gpu.config import LocalBackendConfig
from mlops_gpu.model import TERMINAL_PHASES, Phase

#: The devices of the lease held in this context (thread, task): see ``current_gpus``.
_CURRENT: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "mlops_gpu_lease", default=None
)
_HELD: list[GpuLease] = []
_LOCK = threading.Lock()


def current_gpus() -> tuple[str, ...] | None:
    """The devices of the ``mg.gpus`` lease held in this thread or task, if any."""
    return _CURRENT.get()


class LeaseError(RuntimeError):
    """The lease could not be had (no local backend, timed out, or the run ended)."""


class GpuLease:
    def __init__(
        self,
        gpus: int,
        *,
        project: str,
        gpu_type: str | Sequence[str] | None = None,
        priority: str | None = None,
        name: str | None = None,
        timeout: float | None = None,
        config: str | os.PathLike[str] | None = None,
        release_timeout: float = 30.0,
    ) -> None:
        self.gpus, self.project, self.gpu_type = gpus, project, gpu_type
        self.priority, self.name, self.timeout = priority, name, timeout
        self.config, self.release_timeout = config, release_timeout
        self.run: Any = None
        self.devices: tuple[str, ...] = ()
        self._saved: str | None = None
        self._set_env = False
        self._token: contextvars.Token[tuple[str, ...] | None] | None = None

    def __enter__(self) -> GpuLease:
        from mlops_gpu.sdk.run import _runtime, submit

        rt = _runtime(self.config)
        local = [n for n, b in rt.cfg.backends.items() if isinstance(b, LocalBackendConfig)]
        if not local:
            raise LeaseError("mg.gpus() needs a local backend in the config: the GPUs must be here")
        self.run = submit(
            [sys.executable, "-m", "mlops_gpu.sdk.hold", str(os.getpid())],
            project=self.project, gpus=self.gpus, gpu_type=self.gpu_type,
            priority=self.priority, name=self.name or f"lease:{self.gpus}gpu",
            backend=local[0] if len(local) == 1 else None, preemptible=False,
            config=self.config, max_attempts=1,
        )  # fmt: skip
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            r = self.run.record
            if r.phase in (Phase.STARTING, Phase.RUNNING) and r.placement is not None:
                if r.placement.backend not in local:
                    self.run.cancel()
                    raise LeaseError(f"placed on backend {r.placement.backend}, not a local one")
                break
            if r.phase in TERMINAL_PHASES:
                raise LeaseError(f"lease run {r.id} ended {r.phase.value}: {r.reason}")
            if deadline is not None and time.monotonic() > deadline:
                self.run.cancel()
                raise LeaseError(f"no {self.gpus} GPU(s) within {self.timeout:g}s: {r.reason}")
            time.sleep(0.2)
        self.devices = tuple(d for s in r.placement.slots for d in s.devices)
        self._token = _CURRENT.set(self.devices)
        with _LOCK:
            _HELD.append(self)
            if len(_HELD) == 1:  # the process's environment is one for all its threads
                self._saved = os.environ.get("CUDA_VISIBLE_DEVICES")
                self._set_env = True
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
        with _LOCK:
            if self in _HELD:
                _HELD.remove(self)
            if self._set_env:
                if self._saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = self._saved
        if self.run is not None:
            self.run.cancel()
            # on a timeout the scheduler frees them when it next ticks; the block is done
            with contextlib.suppress(TimeoutError):
                self.run.wait(timeout=self.release_timeout, poll_s=0.1)


def gpus(
    n: int = 1,
    *,
    project: str,
    gpu_type: str | Sequence[str] | None = None,
    priority: str | None = None,
    name: str | None = None,
    timeout: float | None = None,
    config: str | os.PathLike[str] | None = None,
) -> GpuLease:
    """``with mg.gpus(2, project="vision") as lease: ...`` (``lease.devices``)."""
    return GpuLease(n, project=project, gpu_type=gpu_type, priority=priority, name=name,
                    timeout=timeout, config=config)  # fmt: skip
