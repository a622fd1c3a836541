"""Runs: submit (one or a batch), list (paged), get, update, cancel, logs (optionally followed).

Every run route answers 404 for a run of a project the identity has no role in, exactly as for
a run that does not exist."""

from __future__ import annotations

import signal as signal_mod
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from mlops_gpu.model import TERMINAL_PHASES, CheckpointPolicy, Phase, ResourceRequest, Run
from mlops_gpu.model.public import event_to_public, run_to_public
from mlops_gpu.server.auth import Identity, identity
from mlops_gpu.server.errors import ApiError, json_response
from mlops_gpu.server.schemas import RUN_ID, BatchBody, SubmitBody, UpdateBody
from mlops_gpu.server.submits import Submit

router = APIRouter(tags=["runs"])
RunId = Annotated[str, Path(pattern=RUN_ID, description="a run id, r + 10 hex digits")]
Who = Annotated[Identity, Depends(identity)]
CHUNK = 64 * 1024


def _spec(rt: Any, body: SubmitBody, who: Identity, where: str, call: bool = False) -> Any:
    """The RunSpec a body asks for, built as the CLI builds one (``Runtime.spec``), under the
    identity's name. Only ``POST /runs/call`` (``call``) may name a stored callable: a plain
    command naming one would run another run's callable and write its result."""
    from mlops_gpu.controller.calls import call_file
    from mlops_gpu.model.text import spec_text_problems

    if not call and call_file(rt.cfg, tuple(body.command)) is not None:
        raise ApiError(422, "invalid", f"{where}command: names a stored callable; submit "
                       "Python callables with POST /runs/call", f"{where}command")  # fmt: skip

    if not who.can_submit(body.project):
        # a project one cannot see is named as unknown, not as forbidden
        code = 403 if who.can_see(body.project) else 404
        raise ApiError(code, "forbidden" if code == 403 else "not_found",
                       f"{where}project: you cannot submit to project {body.project!r}",
                       f"{where}project")  # fmt: skip
    sig = body.signal if body.signal.startswith("SIG") else "SIG" + body.signal
    if not isinstance(getattr(signal_mod, sig, None), signal_mod.Signals):
        raise ApiError(422, "invalid", f"{where}signal: unknown signal {body.signal!r}",
                       f"{where}signal")  # fmt: skip
    spec = rt.spec(
        tuple(body.command),
        project=body.project,
        name=body.name,
        priority=body.priority,
        user=who.name,
        request=ResourceRequest(
            gpus=body.gpus,
            nodes=body.nodes,
            gpu_types=tuple(body.gpu_types),
            gpu_fraction=body.gpu_fraction,
            gpu_memory_mb=body.gpu_memory_mb,
            mig=body.mig,
            topology_key=body.topology_key,
            topology_required=body.topology_required,
            cpu_milli=body.cpu_milli,
            host_memory_mb=body.host_memory_mb,
        ),
        max_runtime_s=body.max_runtime_s,
        preemptible=body.preemptible,
        checkpoint=CheckpointPolicy(sig, body.grace_s),
        experiment=body.experiment,
        env=dict(body.env),
        workdir=body.workdir,
        backend=body.backend,
        max_attempts=body.max_attempts,
    )
    if problems := spec_text_problems(spec):
        raise ApiError(422, "invalid", where + "; ".join(problems))
    return spec


def _deps_visible(rt: Any, body: SubmitBody, who: Identity) -> None:
    """A dependency on a run of a project the caller has no role in is answered as one on an
    unknown id (as the store words it): its runs do not exist for the caller, and whether it
    exists, or how it ends, must not show through a 422 or a cancelled dependent."""
    from mlops_gpu.state.jobs import expand_ids

    if who.admin:
        return
    for dep in (*body.after, *body.afterok, *body.afternotok, *body.afterany):
        try:
            first = expand_ids(rt.store, [dep])[0]  # (an array's elements share a project)
        except KeyError:
            continue  # unknown: the store's own check says so
        run = rt.store.get(first)
        if run is None or not who.can_see(run.project):
            raise ApiError(422, "rejected", f"dependency on unknown run id {dep!r} (no run or "
                           "array has that id)")  # fmt: skip


def _submit(rt: Any, specs: list[Any]) -> list[Run]:
    from mlops_gpu.controller import SubmitError

    try:
        out: list[Run] = rt.submit_many(specs)
    except SubmitError as e:
        raise ApiError(422, "rejected", str(e)) from None
    return out


@router.post("/runs", status_code=201, summary="Submit one run (or an array)")
async def submit(body: SubmitBody, request: Request, who: Who) -> Response:
    from mlops_gpu.controller import SubmitError
    from mlops_gpu.controller.jobs import request_of, submit_job

    rt = request.app.state.rt
    spec = _spec(rt, body, who, "")
    job = body.job_fields()
    try:
        if not job:  # stored with the runs of concurrent requests, answered once committed
            runs = [await request.app.state.submits.put(Submit(spec))]
        else:  # arrays, dependencies, holds, begin times: one transaction of their own
            await run_in_threadpool(_deps_visible, rt, body, who)
            runs = await run_in_threadpool(submit_job, rt, spec, request_of(job))
    except SubmitError as e:
        raise ApiError(422, "rejected", str(e)) from None
    run = runs[0]
    request.state.audit_target = run.spec.array_id or run.id
    request.state.audit_detail = f"project {run.project}"
    if run.spec.array_id is None:
        return json_response(run_to_public(run), 201)
    # an array: its first element, with the array's id and every element
    return json_response({**run_to_public(run), "array_id": run.spec.array_id,
                          "runs": [run_to_public(r) for r in runs]}, 201)  # fmt: skip


@router.post("/runs/batch", status_code=201, summary="Submit runs in one transaction (all or none)")
def submit_batch(body: BatchBody, request: Request, who: Who) -> dict[str, Any]:
    rt = request.app.state.rt
    for i, b in enumerate(body.runs):
        if job := b.job_fields():
            raise ApiError(422, "invalid", f"runs.{i}.{next(iter(job))}: job control "
                           "(arrays, dependencies, holds, begin times) is for POST /runs",
                           f"runs.{i}.{next(iter(job))}")  # fmt: skip
    specs = [_spec(rt, b, who, f"runs.{i}.") for i, b in enumerate(body.runs)]
    runs = _submit(rt, specs)
    request.state.audit_target = ",".join(r.id for r in runs)[:300]
    request.state.audit_detail = f"{len(runs)} runs"
    return {"runs": [run_to_public(r) for r in runs]}


def _visible_run(request: Request, who: Identity, run_id: str) -> Run:
    run: Run | None = request.app.state.rt.store.get(run_id)
    if run is None or not who.can_see(run.project):
        raise ApiError(404, "not_found", f"no run with id {run_id!r}", "run_id")
    return run


@router.get("/runs", summary="List runs, newest first, page by page")
def list_runs(
    request: Request,
    who: Who,
    project: Annotated[str | None, Query(max_length=200)] = None,
    user: Annotated[str | None, Query(max_length=200)] = None,
    array_id: Annotated[str | None, Query(max_length=200)] = None,
    phase: Annotated[list[Phase] | None, Query()] = None,
    since: datetime | None = None,
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    from mlops_gpu.state.pages import page_public

    visible = who.visible_projects()
    projects: set[str] | None = visible
    if project is not None:
        projects = {project} if visible is None or project in visible else set()
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=timezone.utc)
    page, nxt = page_public(
        request.app.state.rt.store,
        projects=projects,
        user=user,
        phases=phase,
        since=since.timestamp() if since is not None else None,
        before_seq=int(cursor) if cursor is not None else None,
        limit=limit,
        array_id=array_id,
    )
    # the page's dicts hold only JSON types: written as they are (FastAPI's encoder would walk
    # every value of every run again)
    return json_response({"runs": page,
                          "next_cursor": str(nxt) if nxt is not None else None})  # fmt: skip


@router.get("/runs/{run_id}", summary="One run (with its events, its MLflow run, if asked)")
def get_run(
    run_id: RunId, request: Request, who: Who, events: bool = False, mlflow: bool = False
) -> dict[str, Any]:
    run = _visible_run(request, who, run_id)
    out = run_to_public(run)
    store = request.app.state.rt.store
    if events:
        out["events"] = [event_to_public(e) for e in store.events(run.id)]
    if mlflow:  # the current attempt's MLflow run (``Run.mlflow_run_id``), null when none
        out["mlflow_run_id"] = store.mlflow_run_id(run.id, run.attempt)
    return out


@router.post("/runs/{run_id}/cancel", summary="Cancel a run (pending: at once; active: signal)")
def cancel(run_id: RunId, request: Request, who: Who) -> dict[str, Any]:
    from mlops_gpu.controller.views import cancel_run

    request.state.audit_target = run_id
    if request.app.state.rt.store.get(run_id) is None:  # an array id: every element
        return _cancel_array(run_id, request, who)
    run = _visible_run(request, who, run_id)
    if not who.can_cancel(run):
        raise ApiError(403, "forbidden", f"you cannot cancel run {run_id} (a member cancels "
                       "its own runs; a maintainer any run of the project)")  # fmt: skip
    phase, what = cancel_run(request.app.state.rt, run_id)
    request.state.audit_detail = what
    return {"id": run_id, "phase": phase.value, "result": what}


@router.patch("/runs/{run_id}", summary="Change a run (pending: all; running: priority, "
              "a shorter max runtime)")  # fmt: skip
def update(run_id: RunId, body: UpdateBody, request: Request, who: Who) -> dict[str, Any]:
    """As ``mlops-gpu update``: validated as at submit (422), a change the run's phase does not
    allow or that raced its admission is 409; who may: as for cancel."""
    from mlops_gpu.controller.update import UpdateError, update_run

    request.state.audit_target = run_id
    types = tuple(body.gpu_types) if body.gpu_types is not None else None
    changes: dict[str, Any] = {"priority": body.priority, "max_runtime_s": body.max_runtime_s,
                               "gpus": body.gpus, "gpu_types": types}  # fmt: skip
    if request.app.state.rt.store.get(run_id) is None:  # an array id: its pending elements
        return _update_array(run_id, request, who, changes)
    run = _visible_run(request, who, run_id)
    if not who.can_cancel(run):
        raise ApiError(403, "forbidden", f"you cannot update run {run_id} (a member updates "
                       "its own runs; a maintainer any run of the project)")  # fmt: skip
    try:
        after, what = update_run(request.app.state.rt, run_id, **changes)
    except UpdateError as e:
        raise _update_error(e) from None
    request.state.audit_detail = what[:300]
    return {"id": run_id, "phase": after.phase.value, "result": what,
            "run": run_to_public(after)}  # fmt: skip


def _update_error(e: Any) -> ApiError:
    code = {404: "not_found", 409: "conflict"}.get(e.status, "invalid")
    return ApiError(e.status, code, str(e))


def _update_array(
    run_id: str, request: Request, who: Identity, changes: dict[str, Any]
) -> dict[str, Any]:
    """PATCH of an array id: every pending element, in one transaction (``update_array``):
    {"id", "phase": null, "result", "runs": {element: what}, "elements": [runs after]}."""
    from mlops_gpu.controller.update import UpdateError, update_array

    rt = request.app.state.rt
    ids = _array_ids(run_id, request, who, "update")
    try:
        done = update_array(rt, ids, **changes)
    except UpdateError as e:
        raise _update_error(e) from None
    runs = {r.id: what for r, what in done}
    n = sum(1 for r, what in done if r.phase is Phase.PENDING and what.startswith("updated"))
    what = f"{n} of {len(ids)} elements updated"
    request.state.audit_detail = what
    return {"id": run_id, "phase": None, "result": what, "runs": runs,
            "elements": [run_to_public(r) for r, _ in done]}  # fmt: skip


def _array_ids(run_id: str, request: Request, who: Identity, verb: str) -> list[str]:
    """The elements of array ``run_id`` (404 when unknown), each one ``who`` may ``verb``
    (``cancel`` or ``update``: cancel's role rules; 403 naming the first it may not)."""
    from mlops_gpu.state.jobs import expand_ids

    try:
        ids = expand_ids(request.app.state.rt.store, [run_id])
    except KeyError:
        raise ApiError(404, "not_found", f"no run with id {run_id!r}", "run_id") from None
    for rid in ids:
        if not who.can_cancel(_visible_run(request, who, rid)):
            raise ApiError(403, "forbidden", f"you cannot {verb} run {rid} (a member {verb}s "
                           "its own runs; a maintainer any run of the project)")  # fmt: skip
    return list(ids)


def _cancel_array(run_id: str, request: Request, who: Identity) -> dict[str, Any]:
    from mlops_gpu.controller.views import cancel_run

    rt = request.app.state.rt
    ids = _array_ids(run_id, request, who, "cancel")
    done = {rid: cancel_run(rt, rid)[1] for rid in ids}
    what = f"{len(ids)} elements: " + ", ".join(sorted(set(done.values())))
    request.state.audit_detail = what
    return {"id": run_id, "phase": None, "result": what, "runs": done}


def _hold(run_id: str, request: Request, who: Who, held: bool) -> dict[str, Any]:
    from mlops_gpu.state.jobs import expand_ids, set_held

    request.state.audit_target = run_id
    store = request.app.state.rt.store
    try:
        ids = expand_ids(store, [run_id])
    except KeyError:
        raise ApiError(404, "not_found", f"no run with id {run_id!r}", "run_id") from None
    verb = "hold" if held else "release"
    for rid in ids:
        run = _visible_run(request, who, rid)
        if not who.can_cancel(run):
            raise ApiError(403, "forbidden", f"you cannot {verb} run {rid} (a member "
                           f"{verb}s its own runs; a maintainer any of the project)")  # fmt: skip
    done = set_held(store, ids, held, by=who.name)
    what = (
        done[run_id]
        if ids == [run_id]
        else f"{len(ids)} elements: " + ", ".join(sorted({v for v in done.values()}))
    )
    request.state.audit_detail = what
    return {"id": run_id, "result": what, "runs": done}


@router.post("/runs/{run_id}/hold", summary="Hold a pending run, or an array's elements")
def hold(run_id: RunId, request: Request, who: Who) -> dict[str, Any]:
    return _hold(run_id, request, who, True)


@router.post("/runs/{run_id}/release", summary="Release a held run, or an array's elements")
def release(run_id: RunId, request: Request, who: Who) -> dict[str, Any]:
    return _hold(run_id, request, who, False)


@router.get("/runs/{run_id}/logs", summary="A run's stdout then stderr (text)",
            response_class=StreamingResponse)  # fmt: skip
async def logs(
    run_id: RunId,
    request: Request,
    who: Who,
    attempt: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    follow: bool = False,
) -> StreamingResponse:
    rt = request.app.state.rt
    run = await run_in_threadpool(_visible_run, request, who, run_id)
    n = attempt or run.attempt
    from mlops_gpu.controller.views import log_files

    files = await run_in_threadpool(log_files, rt, run, n)
    gen = _follow(rt, run, n) if follow else _whole(rt, run, n)
    # how many log files the attempt has (0: none yet; the CLI says so, as in local mode)
    return StreamingResponse(gen, media_type="text/plain; charset=utf-8",
                             headers={"X-Log-Files": str(len(files))})  # fmt: skip


def _read(path: Any, offset: int = 0) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        fh.seek(offset)
        while chunk := fh.read(CHUNK):
            yield chunk


def _whole(rt: Any, run: Run, attempt: int) -> Iterator[bytes]:
    from mlops_gpu.controller.views import log_files

    for f in log_files(rt, run, attempt):
        if f.name == "stderr.log" and f.stat().st_size:
            yield b"--- stderr ---\n"
        yield from _read(f)


def _follow(rt: Any, run: Run, attempt: int) -> Iterator[bytes]:
    """stdout as it grows until the attempt ends, then stderr (as ``logs --follow``)."""
    from mlops_gpu.controller.views import log_files

    offsets: dict[Any, int] = {}
    while True:
        current = rt.store.get(run.id)
        for f in log_files(rt, run, attempt):
            if f.name == "stdout.log":
                for chunk in _read(f, offsets.get(f, 0)):
                    offsets[f] = offsets.get(f, 0) + len(chunk)
                    yield chunk
        if current is None or current.phase in TERMINAL_PHASES or current.attempt != attempt:
            break
        time.sleep(0.5)
    for f in log_files(rt, run, attempt):
        if f.name == "stderr.log" and f.stat().st_size:
            yield b"--- stderr ---\n"
            yield from _read(f)
