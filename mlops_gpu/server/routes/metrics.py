"""``/metrics``: the Prometheus exposition of the cluster (``controller.prometheus``), the same
text ``mlops-gpu metrics`` serves, for admins only: it names every project, node and GPU, which
a project role may not see (give the scraper its own admin token, Prometheus's
``authorization: {credentials_file: ...}``). A store that cannot be read answers 503, one line."""

from __future__ import annotations

import threading
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from mlops_gpu.server.auth import Identity, identity, require_admin
from mlops_gpu.server.errors import ApiError

router = APIRouter(tags=["metrics"])
Who = Annotated[Identity, Depends(identity)]
_made = threading.Lock()


def _collector(request: Request) -> Any:
    """One collector per app, made at the first scrape (it keeps what it read between scrapes:
    later scrapes read only what changed)."""
    from mlops_gpu.controller.prometheus import StoreCollector

    with _made:
        col = getattr(request.app.state, "metrics", None)
        if col is None:
            col = request.app.state.metrics = StoreCollector(request.app.state.rt)
    return col


@router.get("/metrics", summary="Prometheus metrics of the cluster (admins)")
def metrics(request: Request, who: Who) -> Response:
    from mlops_gpu.controller.prometheus import exposition

    require_admin(who)
    try:
        body, ctype = exposition(_collector(request))
    except Exception as exc:  # the store is unreadable now; the next scrape tries again
        raise ApiError(503, "unavailable", f"cannot read the store: {type(exc).__name__}") from None
    return Response(body, media_type=ctype)
