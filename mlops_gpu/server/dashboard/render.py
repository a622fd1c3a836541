"""Jinja2 rendering of the dashboard's pages: autoescape on for every template (a run's name
or reason holding ``<script>`` or quotes is shown as text), and the headers every page gets:
a Content-Security-Policy allowing only this server's own scripts and styles (no inline script
or style: the heatmap's colours are classes), no framing (a cancel button cannot be
clickjacked), no caching of pages that show a session's data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse

from mlops_gpu.server.dashboard import fmt

HERE = Path(__file__).parent
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,  # every template, whatever its name
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals["utc"] = fmt.utc


def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("who", getattr(request.state, "identity", None))
    context.setdefault("csrf", "")
    context.setdefault("path", request.url.path)
    html = _env.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=HEADERS)
