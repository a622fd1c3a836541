"""The FastAPI app: routes under ``/api/v1``, health at the root, the middlewares (audit
outermost, so that a request refused for its size is audited too; then the body limit), JSON
errors, no CORS (browsers of other origins get no ``Access-Control-Allow-Origin``). In front of
all of it, ``fast_submit`` answers the common single-run submit (``ServerApp``), bounded and
audited as the rest.

Another module adds its own routes with ``app.include_router(router)`` or ``app.mount(path,
asgi_app)`` on what ``create_app`` returns (``extras``: a list of callables, each given the app,
for ``mlops-gpu server``). With extras the single-run submit takes the whole stack too, so that
middleware an extra adds sees it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import Depends, FastAPI, Request

from mlops_gpu.server import errors
from mlops_gpu.server.audit import AuditTrail, audit_writer
from mlops_gpu.server.auth import IdentityCache, IdentityRefresh, authenticate, identity
from mlops_gpu.server.fast_submit import FastSubmit, ServerApp
from mlops_gpu.server.limits import BodyLimit, RateLimiter
from mlops_gpu.server.routes import cluster, health, members, metrics, runs, sdk
from mlops_gpu.server.shared import SharedState
from mlops_gpu.server.submits import submit_writer

API = "/api/v1"


def create_app(
    rt: Any,
    scheduler: Any = None,
    extras: Iterable[Callable[[FastAPI], None]] = (),
    shared: SharedState | None = None,
) -> FastAPI:
    """The API of ``rt`` (a ``controller.Runtime``); ``scheduler``: the ``SchedulerThread``
    beside it, or None (``--no-scheduler``), for ``/readyz`` and ``/api/v1/scheduler``;
    ``shared``: the state every worker of the server shares (rate limit, identity cache
    generation), else this process's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("mlops-gpu")
    except PackageNotFoundError:
        ver = "0"
    app = ServerApp(
        title="mlops-gpu",
        version=ver,
        openapi_url=None,  # served below, behind the identity check
        docs_url=None,
        redoc_url=None,
    )
    app.state.rt = rt
    app.state.scheduler = scheduler
    srv = rt.cfg.server
    shared = shared if shared is not None else SharedState.private()
    app.state.limiter = (
        RateLimiter(srv.rate_per_s, srv.rate_burst, shared) if srv.rate_per_s is not None else None
    )
    # writes of concurrent requests in one transaction each (``group_commit``), and identities
    # read from the store at most every ``IDENTITY_TTL_S`` per token
    app.state.submits = submit_writer(rt)
    app.state.audit_writer = audit_writer(rt.store)
    app.state.identities = IdentityCache(shared=shared)
    app.state.identity_refresh = IdentityRefresh(rt, app.state.identities)

    def _close_writers() -> None:  # after uvicorn drained the requests in flight
        app.state.submits.close()
        app.state.audit_writer.close()

    app.router.on_shutdown.append(_close_writers)
    errors.install(app)
    app.include_router(health.router)
    app.include_router(metrics.router)
    for module in (sdk, runs, cluster, members):
        app.include_router(module.router, prefix=API)

    @app.get(f"{API}/openapi.json", include_in_schema=False, dependencies=[Depends(identity)])
    def openapi(_request: Request) -> dict[str, Any]:
        return app.openapi()

    from mlops_gpu.server import dashboard

    dashboard.install(app)  # the web dashboard at /, same identities as the API
    extras = list(extras)
    for extra in extras:
        extra(app)
    if not extras:  # (an extra's middleware must see every request: no fast path then)
        app.fast = FastSubmit(app.stack, app, srv.max_body_bytes)  # before the whole stack
    # the large limit of POST /runs/call only for an identity that passed (401 before the body)
    app.add_middleware(BodyLimit, max_bytes=srv.max_body_bytes,
                       routes={API + sdk.CALL_PATH: sdk.call_body_limit(srv)},
                       gate=lambda scope: authenticate(app.state, scope))  # fmt: skip
    app.add_middleware(AuditTrail, writer=app.state.audit_writer)
    return app
