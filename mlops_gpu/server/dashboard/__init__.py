"""The web dashboard ``mlops-gpu server`` serves at ``/``: server-rendered pages (Jinja2
templates and a small static CSS and script shipped in the package: no Node.js build), behind
the same identities and roles as the API (``session``: a token login setting an HttpOnly,
SameSite=Strict cookie, or the trusted proxy's header).

Pages: Queue (``/``), Runs, Cluster (the GPU heatmap), Projects, Costs; each refreshes its
figures in the browser every few seconds (``static/dash.js``: ``fetch`` of the page itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STATIC = Path(__file__).parent / "static"


def install(app: Any) -> None:
    """Add the dashboard's routes and its static files (``/static``) to ``app``."""
    from fastapi.staticfiles import StaticFiles

    from mlops_gpu.server.dashboard import routes, session

    session.secret(app)
    app.include_router(routes.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="dashboard-static")
