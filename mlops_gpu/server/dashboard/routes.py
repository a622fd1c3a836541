"""The dashboard's routes: the pages (``/`` the queue, ``/runs``, ``/cluster``, ``/projects``,
``/costs``), the token login (``/login``, ``/logout``) and the cancel button's POST
(``/runs/{id}/cancel``).

Every page resolves its viewer as ``session`` says and shows only what the API would show that
identity: runs of projects it has no role in are never listed, and a cancel button appears only
where ``Identity.can_cancel`` holds (the POST checks it again, then the CSRF token). A page
without a session redirects to the login. Bad query values answer 400 with one line naming the
parameter. A cancel is audited as the API's is (``state.audit``)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from mlops_gpu.model import Phase
from mlops_gpu.server.auth import Identity, token_identity
from mlops_gpu.server.dashboard import session
from mlops_gpu.server.dashboard.render import page
from mlops_gpu.server.schemas import RUN_ID

router = APIRouter(include_in_schema=False)
NAV = (("/", "Queue"), ("/runs", "Runs"), ("/cluster", "Cluster"), ("/projects", "Projects"),
       ("/costs", "Costs"))  # fmt: skip
#: seconds between a page's refreshes in the browser (0: none)
REFRESH = {"/": 10, "/runs": 10, "/cluster": 5, "/projects": 15, "/costs": 0}


class BadParam(Exception):
    pass


def _text(request: Request, name: str) -> str | None:
    v = request.query_params.get(name, "").strip()
    if len(v) > 200:
        raise BadParam(f"{name}: at most 200 characters")
    return v or None


def _int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    v = request.query_params.get(name, "").strip()
    if not v:
        return default
    if not v.isdigit() or not lo <= int(v) <= hi:
        raise BadParam(f"{name}: expected a whole number from {lo} to {hi}, got {v[:40]!r}")
    return int(v)


def _qs(filters: dict[str, Any], **changes: Any) -> str:
    merged = {**filters, **changes}
    return urlencode({k: v for k, v in merged.items() if v not in (None, "")})


def _context(request: Request, who: Identity, title: str) -> dict[str, Any]:
    path = request.url.path
    here = path + (f"?{request.url.query}" if request.url.query else "")
    return {"who": who, "title": title, "nav": NAV, "active": path, "qs": _qs,
            "refresh": REFRESH.get(path, 0), "csrf": session.csrf_token(request, who),
            "next": here, "has_session": session.COOKIE in request.cookies}  # fmt: skip


async def _show(request: Request, render: Callable[[Identity], Response]) -> Response:
    who = await session.viewer(request)
    if who is None:
        return RedirectResponse("/login", status_code=303)

    def run() -> Response:
        try:
            return render(who)
        except BadParam as e:
            return page(request, "error.html", 400, message=str(e),
                        **_context(request, who, "Bad request"))  # fmt: skip

    return await run_in_threadpool(run)


@router.get("/")
async def queue(request: Request) -> Response:
    from mlops_gpu.server.dashboard import queue_data

    def render(who: Identity) -> Response:
        data = queue_data.build(
            request.app.state.rt, who, project=_text(request, "project"),
            user=_text(request, "user"), reason=_text(request, "reason"),
            page=_int(request, "page", 1, 1, 10**6), now=time.time(),
        )  # fmt: skip
        return page(request, "queue.html", q=data, **_context(request, who, "Queue"))

    return await _show(request, render)


@router.get("/runs")
async def runs(request: Request) -> Response:
    from mlops_gpu.server.dashboard import runs_data

    def render(who: Identity) -> Response:
        phase = _text(request, "phase")
        if phase is not None and phase not in {p.value for p in Phase}:
            raise BadParam(f"phase: expected one of {', '.join(p.value for p in Phase)}")
        cursor = _int(request, "cursor", 0, 1, 10**18) or None
        data = runs_data.build(request.app.state.rt, who, project=_text(request, "project"),
                               user=_text(request, "user"), phase=phase, cursor=cursor,
                               now=time.time())  # fmt: skip
        return page(request, "runs.html", r=data, **_context(request, who, "Runs"))

    return await _show(request, render)


@router.get("/cluster")
async def cluster(request: Request) -> Response:
    from mlops_gpu.server.dashboard import cluster_data

    def render(who: Identity) -> Response:
        data = cluster_data.build(cluster_data.views_of(request.app), who)
        return page(request, "cluster.html", h=data, **_context(request, who, "Cluster"))

    return await _show(request, render)


@router.get("/projects")
async def projects(request: Request) -> Response:
    from mlops_gpu.server.dashboard import cluster_data, money_data

    def render(who: Identity) -> Response:
        rows = money_data.projects(cluster_data.views_of(request.app), who)
        return page(request, "projects.html", rows=rows, **_context(request, who, "Projects"))

    return await _show(request, render)


@router.get("/costs")
async def costs(request: Request) -> Response:
    from mlops_gpu.server.dashboard import cluster_data, money_data

    def render(who: Identity) -> Response:
        days = _int(request, "days", 14, 1, 366)
        data = money_data.costs(cluster_data.views_of(request.app), who, days, time.time())
        return page(request, "costs.html", c=data, days=days,
                    **_context(request, who, "Costs"))  # fmt: skip

    return await _show(request, render)


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST (first value of each field; at most 10 fields)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        return {}
    raw = (await request.body()).decode("utf-8", "replace")
    try:
        fields = parse_qs(raw, max_num_fields=10)
    except ValueError:
        return {}
    return {k: v[0] for k, v in fields.items() if v}


def _login_page(request: Request, status: int = 200, error: str = "") -> Response:
    return page(request, "login.html", status, title="Log in", error=error, who=None,
                proxy=request.app.state.rt.cfg.server.auth.mode == "proxy")  # fmt: skip


@router.get("/login")
async def login_form(request: Request) -> Response:
    if await session.viewer(request) is not None:
        return RedirectResponse("/", status_code=303)
    return _login_page(request)


@router.post("/login")
async def login(request: Request) -> Response:
    if not session.same_origin(request):
        return _login_page(request, 403, "refused: the login form must be sent from this server")
    token = (await _form(request)).get("token", "").strip()
    if not token:
        return _login_page(request, 400, "paste your token (mlops-gpu users add prints one)")
    who = await run_in_threadpool(token_identity, request.app.state.rt, token[:300])
    if who is None:
        return _login_page(request, 401, "invalid, expired or revoked token")
    out = RedirectResponse("/", status_code=303)
    session.set_session(out, request, token)
    return out


@router.post("/logout")
async def logout(request: Request) -> Response:
    if not session.same_origin(request):
        return _login_page(request, 403, "refused: log out from this server's own pages")
    out = RedirectResponse("/login", status_code=303)
    session.clear_session(out, request)
    return out


def _safe_next(target: str) -> str:
    # only a path of this server (never "//host" or a scheme: no open redirect)
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@router.post("/runs/{run_id}/cancel")
async def cancel(run_id: str, request: Request) -> Response:
    """Every attempt with an identity is audited with its answer, refused ones included (as
    the API's middleware audits every mutating request)."""
    who = await session.viewer(request)
    if who is None:
        return RedirectResponse("/login", status_code=303)
    form = await _form(request)
    sent = form.get("csrf", "")
    if not (session.same_origin(request) and session.csrf_ok(request, who, sent)):
        status, message = 403, ("refused: the cancel form is stale or was not sent from this "
                                "server's pages; reload the page and retry")  # fmt: skip
        detail = "refused: CSRF token or origin"
    elif not re.fullmatch(RUN_ID, run_id):
        status, message, detail = 404, f"no run with id {run_id[:40]!r}", None
    else:
        status, message, detail = await run_in_threadpool(_cancel, request, who, run_id)
    await run_in_threadpool(_audit, request, who, run_id, status, detail)
    if status != 200:
        ctx = _context(request, who, "Cancel refused")
        return page(request, "error.html", status, message=message, **ctx)
    return RedirectResponse(_safe_next(form.get("next", "/")), status_code=303)


def _cancel(request: Request, who: Identity, run_id: str) -> tuple[int, str, str | None]:
    """(HTTP status, what to tell the user, the audit's detail)."""
    from mlops_gpu.controller.views import cancel_run

    rt = request.app.state.rt
    run = rt.store.get(run_id)
    if run is None or not who.can_see(run.project):
        return 404, f"no run with id {run_id!r}", None
    if not who.can_cancel(run):
        return 403, (f"you cannot cancel run {run_id} (a member cancels its own runs; a "
                     "maintainer any run of the project)"), None  # fmt: skip
    _phase, what = cancel_run(rt, run_id)
    return 200, what, what


def _audit(request: Request, who: Identity, run_id: str, status: int, detail: str | None) -> None:
    from mlops_gpu.state import audit

    client = request.client.host if request.client else None
    audit.record(request.app.state.rt.store, user=who.name,
                 action=f"POST {request.url.path[:200]}", target=run_id[:100],
                 client=client, status=status, detail=detail)  # fmt: skip
