"""``submit`` and ``Run``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mlops_gpu.config import find_config, user_config_path
from mlops_gpu.controller import Runtime, SubmitError
from mlops_gpu.controller.config_watch import stat_signature
from mlops_gpu.controller.jobs import JobRequest, submit_job
from mlops_gpu.model import TERMINAL_PHASES, Phase, RunSpec
from mlops_gpu.model import Run as RunRecord
from mlops_gpu.model.public import run_to_public
from mlops_gpu.model.submit import SubmitFieldError, SubmitRequest
from mlops_gpu.model.text import spec_text_problems

#: config path -> (the file's stat when read, its Runtime): a file edited since is read again,
#: so a notebook's submits see the config as it is now (as each CLI verb does)
_RUNTIMES: dict[str, tuple[tuple[int, int, int] | None, Runtime]] = {}


class RunFailed(RuntimeError):
    """``Run.result()`` of a run that did not succeed."""


def _runtime(config: str | os.PathLike[str] | None) -> Runtime:
    path = find_config(config)
    if path is None:
        path = user_config_path()
        from mlops_gpu.controller.setup import write_starter

        note = write_starter(str(path), virtual_gpus=None, gpu_type="a100-80gb", force=False)
        print(f"mlops-gpu: {note}", file=sys.stderr)
    key = str(Path(path).resolve())
    sig = stat_signature(Path(key))
    cached = _RUNTIMES.get(key)
    if cached is not None and cached[0] == sig:
        return cached[1]
    rt = Runtime.load(path)  # (an edit that does not validate raises here, as in the CLI)
    if cached is not None and cached[1].cfg.store_url == rt.cfg.store_url:
        rt, cfg = cached[1], rt.cfg  # the same store: keep its connections, take the config
        rt.cfg = cfg
        rt.__dict__.pop("backends", None)  # (rebuilt from the new config when next used)
    _RUNTIMES[key] = (sig, rt)
    return rt


def _command(
    target: str | Sequence[str] | Callable[..., Any],
    rt: Runtime,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> tuple[tuple[str, ...], str | None]:
    if callable(target):
        import cloudpickle  # comes with prefect; only needed for callables

        from mlops_gpu.controller.calls import call_command, write_call

        # The job gets the submitter's import path, so functions defined in the submitter's
        # own modules (pickled by reference) import there too; notebook functions (in
        # __main__) are pickled by value anyway.
        payload = cloudpickle.dumps((target, tuple(args), dict(kwargs)))
        path = write_call(rt.cfg, payload, list(sys.path))
        name = getattr(target, "__qualname__", "callable")
        return call_command(sys.executable, path), name
    if isinstance(target, str):
        return tuple(shlex.split(target)), None
    return tuple(str(a) for a in target), None


def submit(
    target: str | Sequence[str] | Callable[..., Any],
    *,
    project: str,
    gpus: int = 1,
    nodes: int = 1,
    gpu_type: str | Sequence[str] | None = None,
    priority: str | None = None,
    name: str | None = None,
    max_runtime: float | None = None,
    experiment: str | None = None,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    backend: str | None = None,
    preemptible: bool = True,
    signal: str = "SIGTERM",
    grace: float = 30.0,
    max_attempts: int | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    config: str | os.PathLike[str] | None = None,
    start_scheduler: bool = True,
    gpu_fraction: float | None = None,
    gpu_memory_mb: int | None = None,
    mig: str | None = None,
    topology_key: str | None = None,
    topology_required: bool = False,
    cpu_milli: int = 0,
    host_memory_mb: int = 0,
    after: Deps = None,
    afterok: Deps = None,
    afternotok: Deps = None,
    afterany: Deps = None,
    after_name: str | Sequence[str] | None = None,
    hold: bool = False,
    begin: float | str | None = None,
) -> Run:
    """Queue a command (a string, an argv list) or a Python callable as a run.

    Job control as the CLI's flags: ``after``/``afterany`` (start after these runs or arrays
    end), ``afterok``, ``afternotok`` (ids or ``Run`` handles), ``after_name`` (after every
    earlier run of yours with that name), ``hold`` (until ``Run.release()``), ``begin``
    (seconds since the epoch, ``"now+2h"`` or an ISO time).

    ``gpus`` is per node, as are ``cpu_milli`` and ``host_memory_mb`` (``gpus=0`` with either:
    a CPU-only run); ``max_runtime`` and ``grace`` are seconds. Raises ``ValueError`` (a
    ``SubmitError``) for a request the config or cluster cannot take, and
    ``mlops_gpu.state.SetupError`` (one line: which file, what to do) for a store or state folder
    that cannot be used, or a background scheduler that cannot start; nothing is queued then.

    In remote mode (``MLOPS_GPU_URL``, or ``mlops-gpu login``; see ``sdk.remote``) the run is
    queued on the server, under the token's identity; ``config`` and ``start_scheduler`` are
    not used, and ``workdir`` is the job's folder on the server's side (default: the backend's).
    """
    asked = submit_request(
        (), project=project, gpus=gpus, nodes=nodes, gpu_type=gpu_type, priority=priority,
        name=name, max_runtime=max_runtime, experiment=experiment, env=env, workdir=workdir,
        backend=backend, preemptible=preemptible, signal=signal, grace=grace,
        max_attempts=max_attempts, gpu_fraction=gpu_fraction, gpu_memory_mb=gpu_memory_mb,
        mig=mig, topology_key=topology_key, topology_required=topology_required,
        cpu_milli=cpu_milli, host_memory_mb=host_memory_mb,
    )  # fmt: skip
    if (remote := remote_target(config)) is not None:
        from mlops_gpu.sdk import remote as rm

        body = asked.body()
        job = job_request(after, afterok, afternotok, afterany, after_name, hold, begin)
        if not job.empty:  # as the CLI's flags, in the request (the server resolves them)
            body.update({"after": list(job.after), "afterok": list(job.afterok),
                         "afternotok": list(job.afternotok), "afterany": list(job.afterany),
                         "after_name": list(job.after_names), "hold": job.hold,
                         "begin": job.begin})  # fmt: skip
        return rm.submit(remote, target, body, args, kwargs or {})
    rt, spec, command = spec_for(target, asked, args=args, kwargs=kwargs, config=config)
    try:
        # text only (model.text): a surrogateescape'd argv or path cannot be stored
        if problems := spec_text_problems(spec):
            raise SubmitError("; ".join(problems))
        req = job_request(after, afterok, afternotok, afterany, after_name, hold, begin)
        if req.empty:
            record = rt.submit(spec, start_scheduler=start_scheduler)
        else:
            record = submit_job(rt, spec, req, start_scheduler=start_scheduler)[0]
    except BaseException:
        if callable(target):  # a submit that fails leaves nothing behind: not its pickle either
            with contextlib.suppress(OSError):
                os.unlink(command[-1])
        raise
    return Run(record.id, rt)


def submit_request(
    command: tuple[str, ...],
    *,
    project: str,
    gpus: int = 1,
    nodes: int = 1,
    gpu_type: str | Sequence[str] | None = None,
    priority: str | None = None,
    name: str | None = None,
    max_runtime: float | None = None,
    experiment: str | None = None,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    backend: str | None = None,
    preemptible: bool = True,
    signal: str = "SIGTERM",
    grace: float = 30.0,
    max_attempts: int | None = None,
    gpu_fraction: float | None = None,
    gpu_memory_mb: int | None = None,
    mig: str | None = None,
    topology_key: str | None = None,
    topology_required: bool = False,
    cpu_milli: int = 0,
    host_memory_mb: int = 0,
) -> SubmitRequest:
    """``submit``'s keywords as the one ``SubmitRequest`` every edge fills (``model.submit``);
    a bad signal is a ``SubmitError`` (a ``ValueError``) naming the keyword."""
    types = (gpu_type,) if isinstance(gpu_type, str) else tuple(gpu_type or ())
    try:
        return SubmitRequest(
            project=project, command=command, name=name, gpus=gpus, nodes=nodes,
            gpu_types=types, gpu_fraction=gpu_fraction, gpu_memory_mb=gpu_memory_mb, mig=mig,
            cpu_milli=cpu_milli, host_memory_mb=host_memory_mb, topology_key=topology_key,
            topology_required=topology_required, priority=priority, max_runtime_s=max_runtime,
            experiment=experiment, backend=backend, preemptible=preemptible, signal=signal,
            grace_s=grace, env=dict(env or {}), workdir=workdir, max_attempts=max_attempts,
        )  # fmt: skip
    except SubmitFieldError as e:
        raise SubmitError(f"{e.field}: {e}") from None


def spec_for(
    target: str | Sequence[str] | Callable[..., Any],
    asked: SubmitRequest,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    config: str | os.PathLike[str] | None = None,
) -> tuple[Runtime, RunSpec, tuple[str, ...]]:
    """(the runtime, the spec ``submit`` queues for ``target`` as ``asked``, its command):
    nothing is stored, but a callable's pickle is written (``command[-1]``; the caller removes
    it if it stores none)."""
    rt = _runtime(config)
    command, callable_name = _command(target, rt, args, kwargs or {})
    asked = dataclasses.replace(asked, command=command, name=asked.name or callable_name)
    return rt, rt.spec_of(asked), command


def build_spec(
    target: str | Sequence[str] | Callable[..., Any],
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    config: str | os.PathLike[str] | None = None,
    **keywords: Any,
) -> tuple[Runtime, RunSpec, tuple[str, ...]]:
    """``spec_for`` with ``submit``'s keywords (``submit_request``): for ``submit_many`` and
    ``map``."""
    asked = submit_request((), **keywords)
    return spec_for(target, asked, args=args, kwargs=kwargs, config=config)


#: Runs a run depends on: ids or handles (anything with an ``id``), one or several.
Deps = str | Any | Sequence[str | Any] | None


def _dep_ids(deps: Deps) -> tuple[str, ...]:
    if deps is None:
        return ()
    items = [deps] if isinstance(deps, str) or hasattr(deps, "id") else list(deps)
    return tuple(d if isinstance(d, str) else str(d.id) for d in items)


def job_request(
    after: Deps = None,
    afterok: Deps = None,
    afternotok: Deps = None,
    afterany: Deps = None,
    after_name: str | Sequence[str] | None = None,
    hold: bool = False,
    begin: float | str | None = None,
    array: str | None = None,
) -> JobRequest:
    names = (after_name,) if isinstance(after_name, str) else tuple(after_name or ())
    return JobRequest(array=array, after=_dep_ids(after), afterok=_dep_ids(afterok),
                      afternotok=_dep_ids(afternotok), afterany=_dep_ids(afterany),
                      after_names=names, hold=hold, begin=begin)  # fmt: skip


def remote_target(config: str | os.PathLike[str] | None) -> Any:
    """The server to talk to (a ``remote.Target``), or None for local mode: as the CLI decides
    (``MLOPS_GPU_URL``, else stored credentials unless a config is named)."""
    from mlops_gpu.remote.credentials import target

    return target(os.fspath(config) if config is not None else None)


def tracking_uri(config: str | os.PathLike[str] | None = None) -> str | None:
    """The MLflow tracking URI the scheduler records runs in (the server's, in remote mode;
    None when it tracks nothing)."""
    if (remote := remote_target(config)) is not None:
        from mlops_gpu.sdk import remote as rm

        return rm.tracking_uri(remote)
    cfg = _runtime(config).cfg
    return cfg.tracking_uri(dict(os.environ)) if cfg.mlflow.enabled else None


def get_run(run_id: str, config: str | os.PathLike[str] | None = None) -> Run:
    if (remote := remote_target(config)) is not None:
        from mlops_gpu.sdk import remote as rm

        return rm.get_run(remote, run_id)
    rt = _runtime(config)
    if rt.store.get(run_id) is None:
        raise KeyError(f"no run with id {run_id!r}")
    return Run(run_id, rt)


def checkpoint_saved(run_id: str | None = None) -> None:
    """Report, from inside a job, that a checkpoint was just saved (the preemption policy
    prefers victims that lose the least work since their last report)."""
    rid = run_id or os.environ.get("MLOPS_GPU_RUN_ID")
    if not rid:
        raise RuntimeError("checkpoint_saved(): not inside a scheduled run (no MLOPS_GPU_RUN_ID)")
    _runtime(None).store.record_checkpoint(rid)


class Run:
    """A handle on a scheduled run; every property reads the store afresh."""

    def __init__(self, run_id: str, rt: Runtime) -> None:
        self.id = run_id
        self._rt = rt

    def __repr__(self) -> str:
        r = self.record
        return f"<Run {self.id} {r.spec.name!r} {r.phase.value}>"

    @property
    def record(self) -> RunRecord:
        r = self._rt.store.get(self.id)
        if r is None:
            raise KeyError(self.id)
        return r

    @property
    def status(self) -> str:
        return self.record.phase.value

    @property
    def reason(self) -> str | None:
        return self.record.reason

    @property
    def mlflow_run_id(self) -> str | None:
        """The MLflow run of the current attempt (None until it starts, or without tracking)."""
        return self._rt.store.mlflow_run_id(self.id, self.record.attempt)

    def info(self) -> dict[str, Any]:
        """The run as the CLI's JSON shows it."""
        return run_to_public(self.record)

    def done(self) -> bool:
        return self.record.phase in TERMINAL_PHASES

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> str:
        """Block until the run ends; returns its final phase. Raises ``TimeoutError``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            r = self.record
            if r.phase in TERMINAL_PHASES:
                return r.phase.value
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.id} is still {r.phase.value} after {timeout}s")
            time.sleep(poll_s)

    def logs(self, attempt: int | None = None, stderr: bool = True) -> str:
        r = self.record
        parts = []
        for b in self._rt.backends.values():
            for f in b.log_files(r.id, attempt or r.attempt):
                if f.name == "stderr.log" and not stderr:
                    continue
                parts.append(f.read_text(errors="replace"))
        return "".join(parts)

    def cancel(self) -> str:
        return self._rt.store.request_cancel(self.id).value

    def update(
        self,
        *,
        priority: str | None = None,
        max_runtime: float | None = None,
        gpus: int | None = None,
        gpu_type: str | Sequence[str] | None = None,
    ) -> Run:
        """Change the run as ``mlops-gpu update`` does (pending: any of these, named as in
        ``submit``; admitted or running: ``priority``, and ``max_runtime`` in seconds shortened);
        ``ValueError`` (one line) when refused, nothing changed then. An ``updated`` event
        records the change."""
        from mlops_gpu.controller.update import update_run

        types = (gpu_type,) if isinstance(gpu_type, str) else gpu_type
        update_run(self._rt, self.id, priority=priority, max_runtime_s=max_runtime,
                   gpus=gpus, gpu_types=tuple(types) if types is not None else None)  # fmt: skip
        return self

    def tracking_uri(self) -> str | None:
        """The MLflow tracking URI the run is recorded in (None: the scheduler tracks nothing)."""
        cfg = self._rt.cfg
        return cfg.tracking_uri(dict(os.environ)) if cfg.mlflow.enabled else None

    def hold(self) -> str:
        """Hold the run while it is pending (it will not start until released)."""
        from mlops_gpu.state.jobs import set_held

        return set_held(self._rt.store, [self.id], True)[self.id]

    def release(self) -> str:
        """Release a held run: it queues again."""
        from mlops_gpu.state.jobs import set_held

        return set_held(self._rt.store, [self.id], False)[self.id]

    def result(self, timeout: float | None = None) -> Any:
        """For a submitted callable: wait, then return its value (or raise ``RunFailed``)."""
        import pickle

        phase = self.wait(timeout)
        r = self.record
        if r.spec.command[1:3] != ("-m", "mlops_gpu.sdk.call"):
            raise TypeError(f"run {self.id} is a command, not a callable: it has no result")
        out = Path(r.spec.command[3]).with_suffix(".result")
        if phase != Phase.SUCCEEDED.value or not out.exists():
            raise RunFailed(f"run {self.id} {phase}: {r.reason}\n{self.logs()[-2000:]}")
        return pickle.loads(out.read_bytes())
