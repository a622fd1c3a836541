"""What the SDK needs beyond the CLI's routes: Python callables travel in the request
(``POST /runs/call``), their value comes back (``GET /runs/{id}/result``), and a client learns
the server's settings (``GET /settings``: the callable limit, the MLflow tracking URI and
artifact root).

Invariants:
- The body of ``POST /runs/call`` is read only for an authenticated identity (``limits``: a
  401 comes before the body). Its ``payload`` is held to ``server.max_call_bytes`` and the
  rest of the body to ``server.max_body_bytes`` (413 naming the setting beyond).
- The server never unpickles a payload: it checks the size (``server.max_call_bytes``, 413
  naming it beyond) and the pickle framing, stores it where local-mode callables are stored
  (``controller.calls``), and the run's command is the server's own ``python -m
  mlops_gpu.sdk.call PATH``: the client never names a path, and a result is read only from that
  folder. The run is checked as every submit is (``Runtime.submit``: the same message as the
  local CLI's on a 422) and stored under the caller's identity.
- A payload whose submit fails leaves no file behind.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import sys
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field, StringConstraints

from mlops_gpu.model import TERMINAL_PHASES
from mlops_gpu.model.public import run_to_public
from mlops_gpu.server.auth import Identity, identity
from mlops_gpu.server.errors import ApiError
from mlops_gpu.server.limits import BODY_BYTES
from mlops_gpu.server.routes.runs import RunId, _deps_visible, _spec, _visible_run
from mlops_gpu.server.schemas import Arg, SubmitBody

router = APIRouter(tags=["sdk"])
Who = Annotated[Identity, Depends(identity)]
CALL_PATH = "/runs/call"


class CallBody(SubmitBody):
    """A submit whose job is a Python callable: ``payload`` is base64 of the cloudpickle of
    ``(fn, args, kwargs)``; ``command`` must be left out (the server writes it)."""

    command: list[Arg] = Field(default_factory=list, max_length=0)
    payload: Annotated[str, StringConstraints(min_length=1)]


def call_limit_message(max_call_bytes: int) -> str:
    return (f"the callable's payload is over the server's limit of {max_call_bytes} bytes "
            "(server.max_call_bytes)")  # fmt: skip


def call_body_limit(srv: Any) -> tuple[int, str]:
    """The body limit of ``POST /runs/call``: the payload's limit in base64, plus the general
    body limit for the rest of the request."""
    return -(-srv.max_call_bytes // 3) * 4 + srv.max_body_bytes, call_limit_message(
        srv.max_call_bytes
    )


@router.post(CALL_PATH, status_code=201, summary="Submit a Python callable (cloudpickled)")
def submit_call(body: CallBody, request: Request, who: Who) -> dict[str, Any]:
    from mlops_gpu.controller import SubmitError
    from mlops_gpu.controller.calls import call_command, write_call
    from mlops_gpu.controller.jobs import request_of, submit_job

    rt = request.app.state.rt
    limit = rt.cfg.server.max_call_bytes
    rest = int((request.scope.get("state") or {}).get(BODY_BYTES, 0)) - len(body.payload)
    if rest > rt.cfg.server.max_body_bytes:  # the body's other fields: the general limit
        raise ApiError(413, "too_large", f"the request without its payload is over the "
                       f"server's limit of {rt.cfg.server.max_body_bytes} bytes "
                       "(server.max_body_bytes)")  # fmt: skip
    try:
        payload = base64.b64decode(body.payload, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "invalid", "payload: expected base64", "payload") from None
    if len(payload) > limit:
        raise ApiError(413, "too_large", call_limit_message(limit), "payload")
    if payload[:1] != b"\x80":  # every pickle of protocol 2 or later starts so
        raise ApiError(422, "invalid", "payload: not a pickle (cloudpickle of (fn, args, "
                       "kwargs))", "payload")  # fmt: skip
    job = body.job_fields()
    if "array" in job:  # one payload per element: mg.map queues arrays of callables locally
        raise ApiError(422, "invalid", "array: a callable is submitted one run at a time here",
                       "array")  # fmt: skip
    # the caller's rights and the body, checked before anything is written
    _spec(rt, body.model_copy(update={"command": [sys.executable]}), who, "")
    _deps_visible(rt, body, who)
    path = write_call(rt.cfg, payload, [])
    try:
        command = call_command(sys.executable, path)
        spec = _spec(rt, body.model_copy(update={"command": list(command)}), who, "", call=True)
        # dependencies, a hold or a begin time as on POST /runs
        run = submit_job(rt, spec, request_of(job))[0] if job else rt.submit(spec)
    except SubmitError as e:
        with contextlib.suppress(OSError):
            path.unlink()
        raise ApiError(422, "rejected", str(e)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    request.state.audit_target = run.id
    request.state.audit_detail = f"project {run.project}; callable of {len(payload)} bytes"
    return run_to_public(run)


@router.get("/runs/{run_id}/result", summary="A callable run's return value (pickled)",
            response_class=Response)  # fmt: skip
def result(run_id: RunId, request: Request, who: Who) -> Response:
    from mlops_gpu.controller.calls import call_file

    rt = request.app.state.rt
    run = _visible_run(request, who, run_id)
    path = call_file(rt.cfg, tuple(run.spec.command))
    if path is None:
        raise ApiError(409, "not_callable",
                       f"run {run_id} is a command, not a callable: it has no result")  # fmt: skip
    if run.phase not in TERMINAL_PHASES:
        raise ApiError(409, "not_finished", f"run {run_id} is still {run.phase.value}")
    try:
        data = path.with_suffix(".result").read_bytes()
    except OSError:
        raise ApiError(404, "no_result",
                       f"run {run_id} {run.phase.value}: {run.reason}") from None  # fmt: skip
    return Response(data, media_type="application/octet-stream")


def _without_password(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@router.get("/settings", summary="What a client needs to know of this server")
def settings(request: Request, who: Who) -> dict[str, Any]:
    import os

    cfg = request.app.state.rt.cfg
    uri = cfg.tracking_uri(dict(os.environ)) if cfg.mlflow.enabled else None
    return {
        "max_call_bytes": cfg.server.max_call_bytes,
        "mlflow_enabled": cfg.mlflow.enabled,
        "tracking_uri": _without_password(uri) if uri else None,
        # where experiments the scheduler creates keep artifacts (a client creating one
        # first, as ``mlflow run --backend mlops-gpu`` does, puts it at the same place)
        "artifact_root": cfg.artifact_root(uri) if uri else None,
    }
