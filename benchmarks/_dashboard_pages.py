"""The web dashboard's pages under load (``dashboard_load.py`` calls ``measure``): the
server-side time of each page, in process through the app's ASGI stack (routing, the session
cookie's identity, the page's reads, Jinja2 rendering; no network), as an admin (who sees every
run, the largest page), ``requests`` times each after ``warmup`` requests, with the app kept
between requests as a server keeps it.

Pages: ``queue`` (the first page of the queue and its counts by reason), ``queue_deep`` (a page
in the middle of the 50,000), ``queue_filtered`` (one project and reason code), ``runs``,
``cluster`` (the heatmap of every GPU), ``projects``, ``costs``. Target (issue 27): every page
p95 <= 300 ms."""

from __future__ import annotations

import time
from typing import Any

PAGES = {
    "queue": "/",
    "queue_deep": "/?page=500",
    "queue_filtered": "/?project=team-03&reason=quota",
    "runs": "/runs",
    "cluster": "/cluster",
    "projects": "/projects",
    "costs": "/costs",
}
TARGET_MS = 300.0


def _p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def measure(rt: Any, warmup: int, requests: int) -> dict[str, dict[str, float]]:
    """page -> {"p50_ms", "p95_ms", "p95_cpu_ms", "bytes"}."""
    from fastapi.testclient import TestClient

    from mlops_gpu.server.app import create_app
    from mlops_gpu.state.users import add_user

    token = add_user(rt.store, "bench-admin", admin=True, projects={}, ttl_s=86400)
    app = create_app(rt, None)
    out: dict[str, dict[str, float]] = {}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        client.cookies.set("mlops_gpu_session", token)
        for name, path in PAGES.items():
            for _ in range(warmup):
                r = client.get(path)
                assert r.status_code == 200, (path, r.status_code, r.text[:500])
            wall, cpu, size = [], [], 0
            for _ in range(requests):
                t, c = time.perf_counter(), time.process_time()
                r = client.get(path)
                wall.append((time.perf_counter() - t) * 1000)
                cpu.append((time.process_time() - c) * 1000)
                size = len(r.content)
            wall.sort()
            out[name] = {"p50_ms": round(wall[len(wall) // 2], 1), "p95_ms": round(_p95(wall), 1),
                         "p95_cpu_ms": round(_p95(cpu), 1), "bytes": size}  # fmt: skip
    return out


def table(pages: dict[str, dict[str, float]]) -> str:
    lines = [f"{'page':<16}{'p50 ms':>9}{'p95 ms':>9}{'p95 cpu':>9}{'KiB':>8}"]
    for name, m in pages.items():
        lines.append(f"{name:<16}{m['p50_ms']:>9}{m['p95_ms']:>9}{m['p95_cpu_ms']:>9}"
                     f"{m['bytes'] / 1024:>8.0f}")  # fmt: skip
    ok = all(m["p95_ms"] <= TARGET_MS for m in pages.values())
    lines.append(f"target (every page p95 <= {TARGET_MS:.0f} ms): {'met' if ok else 'NOT met'}")
    return "\n".join(lines)
