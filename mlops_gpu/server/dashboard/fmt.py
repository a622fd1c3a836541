"""Small text helpers the page builders and templates share (times, GPU requests, amounts)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any


def utc(t: float | None) -> str:
    """``2026-12-02 10:58Z`` (empty for None)."""
    if t is None:
        return ""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%MZ")


def day(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def span(seconds: float) -> str:
    """A duration in its largest units: ``45s``, ``12m``, ``3h05m``, ``2d04h``."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def relative(t: float | None, now: float | None = None) -> str:
    """``in 12m`` / ``12m ago`` (empty for None)."""
    if t is None:
        return ""
    d = t - (time.time() if now is None else now)
    return f"in {span(d)}" if d >= 0 else f"{span(d)} ago"


def request_text(req: dict[str, Any]) -> str:
    """What a stored request asks for: ``2x8 GPU a100-80gb``, ``0.5 GPU``, ``MIG 1g.10gb``
    (no type: any type)."""
    types = "|".join(req.get("gpu_types") or [])
    if req.get("mig"):
        what = f"MIG {req['mig']}"
    elif req.get("gpu_fraction"):
        what = f"{req['gpu_fraction']:g} GPU"
    elif req.get("gpu_memory_mb"):
        what = f"GPU {req['gpu_memory_mb']} MB"
    else:
        what = f"{req.get('gpus', 0)} GPU" if req.get("nodes", 1) == 1 else ""
        if not what:
            what = f"{req.get('nodes')}x{req.get('gpus', 0)} GPU"
    return f"{what} {types}".strip()


def spec_request(spec_text: str) -> str:
    try:
        return request_text(json.loads(spec_text).get("request", {}))
    except (ValueError, AttributeError, TypeError):
        return ""


def num(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"
