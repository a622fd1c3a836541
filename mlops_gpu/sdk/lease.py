"""``mg.gpus(...)``: GPUs of the local backend held by the calling process for a ``with`` block,
under the same quotas, priorities and fair share as every run.

The lease is a scheduled run whose job only waits (``mlops_gpu.sdk.hold``): it is queued, and
once admitted on a local backend its devices are the caller's. Inside a scheduled run (a job
of the scheduler, e.g. a Prefect flow run of an ``mlops-gpu`` pool) a lease is first carved
from the run's own devices (``lease_pool``; ``lease.run`` is then None), and queues for other
GPUs only when too few of those are free.

What the holder can rely on:
- ``lease.devices`` and ``mg.current_gpus()`` (in the holding thread or task) are exactly the
  lease's devices, whatever other threads hold.
- ``lease.call(fn, ...)`` runs ``fn`` in a child process whose ``CUDA_VISIBLE_DEVICES`` is
  exactly the lease's devices (``mlops_gpu.sdk.isolated``): the only way for concurrent leases
  of one process to each see their own devices there, since the variable is one per process.
- ``CUDA_VISIBLE_DEVICES`` of the calling process is set for the block (``set_env``, default
  on) only when the lease is the process's only one, and restored after; with leases held
  concurrently by threads it keeps the first one's value, which the others must not read.

Leaving the block releases the lease: its run ends ``succeeded`` (``failed`` when the block
raised), and its GPUs are free when ``__exit__`` returns (or after ``release_timeout``, when
it is cancelled instead).

Invariants:
- A lease never outlives its holder: the job watches the caller's pid and ends when the caller
  does, so a crashed or killed caller does not keep GPUs.
- Leases are not preemptible (the scheduler cannot take GPUs back from code it does not run).
- Only local backends: the devices must be on the caller's host. So remote mode (a server,
  ``sdk.remote``) queues no lease: only devices of the caller's own scheduled run are carved.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from mlops_gpu.config import LocalBackendConfig
from mlops_gpu.model import TERMINAL_PHASES, Phase
from mlops_gpu.sdk.lease_pool import OWN

#: The devices of the lease held in this context (thread, task): see ``current_gpus``.
_CURRENT: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "mlops_gpu_lease", default=None
)
_HELD: list[GpuLease] = []
_LOCK = threading.Lock()


def current_gpus() -> tuple[str, ...] | None:
    """The devices of the ``mg.gpus`` lease held in this thread or task, if any; in the child
    process of ``lease.call`` (``@gpu_task``), its lease's devices."""
    held = _CURRENT.get()
    if held is None and "MLOPS_GPU_LEASE_DEVICES" in os.environ:
        return tuple(d for d in os.environ["MLOPS_GPU_LEASE_DEVICES"].split(",") if d)
    return held


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
        set_env: bool = True,
    ) -> None:
        self.gpus, self.project, self.gpu_type = gpus, project, gpu_type
        self.priority, self.name, self.timeout = priority, name, timeout
        self.config, self.release_timeout = config, release_timeout
        self.set_env = set_env
        self.run: Any = None
        #: Whether the devices were carved from the process's own run (no scheduled run).
        self.carved = False
        self.devices: tuple[str, ...] = ()
        self._release: Path | None = None
        self._saved: str | None = None
        self._set_env = False
        self._token: contextvars.Token[tuple[str, ...] | None] | None = None

    def __enter__(self) -> GpuLease:
        carved = OWN.take(self.gpus, self.gpu_type)
        if carved is not None:
            self.devices, self.carved = carved, True
        else:
            self.devices = self._queue()
        self._token = _CURRENT.set(self.devices)
        with _LOCK:
            _HELD.append(self)
            if len(_HELD) == 1 and self.set_env:  # one environment for all the threads
                self._saved = os.environ.get("CUDA_VISIBLE_DEVICES")
                self._set_env = True
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        return self

    def _queue(self) -> tuple[str, ...]:
        """A scheduled run that holds the GPUs; its devices once it runs."""
        from mlops_gpu.sdk.run import _runtime, remote_target, submit

        if remote_target(self.config) is not None:
            raise LeaseError(
                "mg.gpus() queues for GPUs of this host's local backend: it needs local mode "
                "(this host's config), not a server (MLOPS_GPU_URL or `mlops-gpu login`); "
                "inside a scheduled run it takes the run's own"
            )
        rt = _runtime(self.config)
        local = [n for n, b in rt.cfg.backends.items() if isinstance(b, LocalBackendConfig)]
        if not local:
            raise LeaseError("mg.gpus() needs a local backend in the config: the GPUs must be here")
        leases = rt.cfg.state_path / "leases"
        leases.mkdir(parents=True, exist_ok=True)
        self._release = leases / f"{uuid.uuid4().hex}.release"
        self.run = submit(
            [sys.executable, "-m", "mlops_gpu.sdk.hold", str(os.getpid()), str(self._release)],
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
                return tuple(d for s in r.placement.slots for d in s.devices)
            if r.phase in TERMINAL_PHASES:
                raise LeaseError(f"lease run {r.id} ended {r.phase.value}: {r.reason}")
            if deadline is not None and time.monotonic() > deadline:
                self.run.cancel()
                raise LeaseError(f"no {self.gpus} GPU(s) within {self.timeout:g}s: {r.reason}")
            time.sleep(0.2)

    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a child process whose ``CUDA_VISIBLE_DEVICES`` is exactly
        this lease's devices; its value, or its exception raised here."""
        from mlops_gpu.sdk.isolated import call_in_child

        return call_in_child(fn, args, kwargs, self.devices)

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
        if self.carved:
            OWN.give(self.devices)
            return
        if self.run is None:
            return
        outcome = "succeeded" if et is None else "failed"
        try:
            assert self._release is not None
            tmp = self._release.with_suffix(".tmp")
            tmp.write_text(outcome)
            os.replace(tmp, self._release)  # the hold job exits 0 or 1: the lease's outcome
            self.run.wait(timeout=self.release_timeout, poll_s=0.05)
        except (OSError, TimeoutError):
            # the job could not be told, or the scheduler did not see it end in time: a cancel
            # frees the GPUs at its next tick; the block is done either way
            self.run.cancel()
        finally:
            if self._release is not None:
                self._release.unlink(missing_ok=True)


def gpus(
    n: int = 1,
    *,
    project: str,
    gpu_type: str | Sequence[str] | None = None,
    priority: str | None = None,
    name: str | None = None,
    timeout: float | None = None,
    config: str | os.PathLike[str] | None = None,
    set_env: bool = True,
) -> GpuLease:
    """``with mg.gpus(2, project="vision") as lease: ...`` (``lease.devices``,
    ``lease.call(fn, ...)``)."""
    return GpuLease(n, project=project, gpu_type=gpu_type, priority=priority, name=name,
                    timeout=timeout, config=config, set_env=set_env)  # fmt: skip
