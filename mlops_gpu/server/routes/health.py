"""``/livez`` (the process answers) and ``/readyz`` (it can read the store): no identity
needed, nothing about runs told."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


@router.get("/livez", summary="The server process answers")
def livez() -> dict[str, Any]:
    return {"ok": True}


@router.get("/readyz", summary="The server can read its store")
def readyz(request: Request) -> Any:
    thread = request.app.state.scheduler
    sched = thread.role if thread is not None else "off"
    try:
        request.app.state.rt.store.revision()
    except Exception:
        return JSONResponse({"ok": False, "store": "unavailable", "scheduler": sched}, 503)
    return {"ok": True, "store": "ok", "scheduler": sched}
