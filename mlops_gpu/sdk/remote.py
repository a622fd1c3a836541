"""The SDK in remote mode: ``mg.submit``, ``mg.get_run`` and ``Run`` talk to a ``mlops-gpu
server`` (``mlops_gpu.remote``) when ``MLOPS_GPU_URL`` is set or ``mlops-gpu login`` stored
credentials (as the CLI decides: ``remote.credentials.target``).

Invariants:
- Remote mode never reads the config and never opens the store: every answer comes from the
  server, and the checks that need the cluster (``Runtime.problems``) run there. A request the
  server refuses raises what local mode raises (``SubmitError`` for a bad request, ``KeyError``
  for an unknown run), with the server's one-line message.
- The run's user is the token's identity: ``MLOPS_GPU_USER`` is not sent.
- A callable travels in the request (cloudpickle, base64; its own module by value unless
  installed, as the server has the packages, not the submitter's files), up to the server's
  ``server.max_call_bytes``; a bigger one is refused here, before it is sent, with one line
  naming the limit. Its value comes back through the API (``Run.result()``).
"""

from __future__ import annotations

import base64
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mlops_gpu.model import TERMINAL_PHASES, Phase
from mlops_gpu.remote import Client, RemoteError, Target
from mlops_gpu.sdk.run import Run, RunFailed  # (run.py imports this module lazily: no cycle)

_CLIENTS: dict[Target, Client] = {}
_LOCK = threading.Lock()
STDERR_MARK = "--- stderr ---\n"  # what the server's logs route puts before stderr


def client(t: Target) -> Client:
    with _LOCK:
        c = _CLIENTS.get(t)
        if c is None:
            c = _CLIENTS[t] = Client(t)
        return c


_LIMITS: dict[Target, tuple[float, int]] = {}  # target -> (when asked, max_call_bytes)


def _call_limit(t: Target) -> int:
    """The server's callable limit, asked at most once a minute (one request less per submit;
    the server checks every payload anyway, so a limit changed since is still enforced)."""
    now = time.monotonic()
    with _LOCK:
        cached = _LIMITS.get(t)
    if cached is not None and now - cached[0] < 60.0:
        return cached[1]
    limit = int(client(t).settings()["max_call_bytes"])
    with _LOCK:
        _LIMITS[t] = (now, limit)
    return limit


def _submit_error(e: RemoteError) -> Exception:
    from mlops_gpu.controller import SubmitError

    # a request the server's config or cluster cannot take (not: no identity, no right)
    if e.status in (400, 404, 409, 413, 422):
        return SubmitError(str(e))
    return e


def submit(
    t: Target,
    target: str | Sequence[str] | Callable[..., Any],
    body: dict[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> RemoteRun:
    """Queue ``target`` on the server (``body``: the submit's fields, as ``POST /runs``)."""
    import shlex

    c = client(t)
    try:
        if callable(target):
            import cloudpickle  # comes with prefect; only needed for callables

            payload = _by_value(cloudpickle, target, (target, tuple(args), dict(kwargs)))
            limit = _call_limit(t)
            if len(payload) > limit:
                from mlops_gpu.controller import SubmitError

                raise SubmitError(
                    f"the callable's payload is {len(payload)} bytes, over the server's limit "
                    f"of {limit} bytes (server.max_call_bytes)"
                )
            body = {**body, "name": body.get("name") or getattr(target, "__qualname__",
                                                                "callable")}  # fmt: skip
            body["payload"] = base64.b64encode(payload).decode()
            public = c.submit_call(body)
        else:
            argv = shlex.split(target) if isinstance(target, str) else [str(a) for a in target]
            public = c.submit({**body, "command": argv})
    except RemoteError as e:
        raise _submit_error(e) from None
    return RemoteRun(public["id"], t)


def _by_value(cloudpickle: Any, fn: Any, what: Any) -> bytes:
    """The cloudpickle of ``what``, with ``fn``'s own module by value unless it is installed
    (in site-packages, or the standard library) or mlops-gpu's own: the server has the
    submitter's packages, not the submitter's own files (a notebook's functions are by value
    anyway)."""
    import sysconfig

    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    installed = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                 sysconfig.get_paths()["stdlib"])  # fmt: skip
    if (
        module is None
        or module.__name__.split(".")[0] in ("mlops_gpu", "mlops_gpu_prefect")  # the server's
        or module.__name__ == "__main__"
        or file is None
        or any(str(file).startswith(p) for p in installed)
    ):
        return bytes(cloudpickle.dumps(what))
    cloudpickle.register_pickle_by_value(module)
    try:
        return bytes(cloudpickle.dumps(what))
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def get_run(t: Target, run_id: str) -> RemoteRun:
    try:
        client(t).get(run_id)  # (it exists and the caller sees it)
    except RemoteError as e:
        if e.status in (404, 422):
            raise KeyError(f"no run with id {run_id!r}") from None
        raise
    return RemoteRun(run_id, t)


def tracking_uri(t: Target) -> str | None:
    """The server's MLflow tracking URI (None: it tracks nothing)."""
    uri = client(t).settings()["tracking_uri"]
    return str(uri) if uri else None


class RemoteRecord:
    """A run as the server shows it (its public JSON), read as a store record is read:
    ``phase`` (a ``Phase``), ``reason``, ``attempt``, ``exit_code`` (not served: None)."""

    def __init__(self, public: dict[str, Any]) -> None:
        self.public = public
        self.id: str = public["id"]
        self.phase = Phase(public["phase"])
        self.reason: str | None = public["reason"]
        self.reason_code: str | None = public["reason_code"]
        self.attempt: int = public["attempt"]
        self.exit_code: int | None = None


class RemoteRun(Run):
    """``Run`` of a server: every property asks the server afresh."""

    def __init__(self, run_id: str, t: Target) -> None:
        self.id = run_id
        self._rt = None  # type: ignore[assignment]
        self._target = t

    def _get(self, events: bool = False, mlflow: bool = False) -> dict[str, Any]:
        try:
            return client(self._target).get(self.id, events=events, mlflow=mlflow)
        except RemoteError as e:
            if e.status == 404:
                raise KeyError(self.id) from None
            raise

    def __repr__(self) -> str:
        r = self._get()
        return f"<Run {self.id} {r['name']!r} {r['phase']}>"

    @property
    def record(self) -> RemoteRecord:  # type: ignore[override]
        return RemoteRecord(self._get())

    @property
    def mlflow_run_id(self) -> str | None:
        found = self._get(mlflow=True).get("mlflow_run_id")
        return str(found) if found is not None else None

    def info(self) -> dict[str, Any]:
        return self._get()

    def done(self) -> bool:
        return self.record.phase in TERMINAL_PHASES

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            phase = self.record.phase
            if phase in TERMINAL_PHASES:
                return phase.value
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.id} is still {phase.value} after {timeout}s")
            time.sleep(poll_s)

    def logs(self, attempt: int | None = None, stderr: bool = True) -> str:
        stream = client(self._target).logs(self.id, attempt, follow=False)
        next(stream)  # (the number of log files)
        text = b"".join(c for c in stream if isinstance(c, bytes)).decode(errors="replace")
        if STDERR_MARK not in text:
            return text
        at = text.rindex(STDERR_MARK)  # (stdout may hold the mark too; stderr comes last)
        return text[:at] + (text[at + len(STDERR_MARK) :] if stderr else "")

    def cancel(self) -> str:
        try:
            return str(client(self._target).cancel(self.id)["phase"])
        except RemoteError as e:
            if e.status == 404:
                raise KeyError(self.id) from None
            raise

    def update(
        self,
        *,
        priority: str | None = None,
        max_runtime: float | None = None,
        gpus: int | None = None,
        gpu_type: str | Sequence[str] | None = None,
    ) -> RemoteRun:
        """``Run.update`` through ``PATCH /api/v1/runs/{id}`` (the server validates it as
        ``mlops-gpu update`` does); ``ValueError`` (the server's one line) when refused."""
        types = [gpu_type] if isinstance(gpu_type, str) else gpu_type
        fields = {
            "priority": priority,
            "max_runtime_s": max_runtime,
            "gpus": gpus,
            "gpu_types": types,
        }
        body = {k: v for k, v in fields.items() if v is not None}
        try:
            client(self._target).update(self.id, body)
        except RemoteError as e:
            if e.status in (404, 409, 422):  # as the local Run.update's UpdateError
                raise ValueError(str(e)) from None
            raise
        return self

    def hold(self) -> str:
        """``Run.hold`` through ``POST /api/v1/runs/{id}/hold``."""
        return self._hold(True)

    def release(self) -> str:
        """``Run.release`` through ``POST /api/v1/runs/{id}/release``."""
        return self._hold(False)

    def _hold(self, held: bool) -> str:
        try:
            return str(client(self._target).hold(self.id, held)["result"])
        except RemoteError as e:
            if e.status == 404:
                raise KeyError(self.id) from None
            raise

    def tracking_uri(self) -> str | None:
        return tracking_uri(self._target)

    def result(self, timeout: float | None = None) -> Any:
        import pickle

        phase = self.wait(timeout)
        try:
            data = client(self._target).result(self.id)
        except RemoteError as e:
            if e.code == "not_callable":
                raise TypeError(f"run {self.id} is a command, not a callable: it has no "
                                "result") from None  # fmt: skip
            if e.status == 404:
                r = self.record
                raise RunFailed(f"run {self.id} {phase}: {r.reason}\n"
                                f"{self.logs()[-2000:]}") from None  # fmt: skip
            raise
        if phase != Phase.SUCCEEDED.value:
            raise RunFailed(f"run {self.id} {phase}: {self.record.reason}\n{self.logs()[-2000:]}")
        return pickle.loads(data)
