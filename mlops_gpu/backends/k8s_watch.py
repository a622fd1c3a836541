"""A list-and-watch cache of the Kubernetes backend's Jobs (client-go's informer, reduced): one
list, then one watch stream of changes, so that a poll reads memory instead of asking the API
server to serialise every Job of ours each tick (800 Jobs is megabytes of JSON a second).

Invariants:
- ``jobs()`` is None unless the cache is synced: a list succeeded and the watch since has not
  failed. The caller then lists (and an API that does not answer raises there, as before).
- A Job missing from a synced cache may be one created a moment ago whose event is in flight:
  the caller confirms with a direct read before calling it gone.
- Watch errors (410 Gone, a dropped stream, an API restart) mark the cache unsynced and start
  over with a fresh list after a short pause; nothing is lost, a poll meanwhile lists.
- The thread is a daemon that ends itself when nobody has read the cache for ``IDLE_S`` (a
  backend dropped without a word); the next read starts it again. Its API calls go through
  the backend's rate-limited ``call``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("mlops_gpu.backends.k8s")

#: Server-side end of each watch request (it is then resumed from the last resourceVersion).
WATCH_S = 60
#: Pause before listing again after an error.
RETRY_S = 1.0
#: The thread ends after this long without a read.
IDLE_S = 120.0


class JobCache:
    def __init__(self, call: Callable[..., Any], batch: Any, namespace: str, selector: str) -> None:
        self._call, self._batch = call, batch
        self.namespace, self.selector = namespace, selector
        self._jobs: dict[str, dict[str, Any]] = {}
        self._synced = False
        self._thread: threading.Thread | None = None
        self._read_at = time.monotonic()

    def jobs(self) -> dict[str, dict[str, Any]] | None:
        """Our Jobs by name, or None while the cache is not synced (the first read starts the
        watch, so it answers None)."""
        self.touch()
        if not self._synced:
            return None
        return dict(self._jobs)

    def touch(self) -> None:
        """Keep the watch going (start it if it is not): a read without the copy."""
        self._read_at = time.monotonic()
        if self._thread is None or not self._thread.is_alive():
            self._synced = False
            self._thread = threading.Thread(target=self._run, name="k8s-job-watch", daemon=True)
            self._thread.start()

    def _idle(self) -> bool:
        return time.monotonic() - self._read_at > IDLE_S

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._idle():
            try:
                rv: str | None = self._list()
                self._synced = True
                while rv is not None and not self._idle():
                    rv = self._watch(rv)
            except Exception as e:  # the API is away, or answered nonsense: list again later
                log.debug("job watch: %s; listing again", e)
            self._synced = False
            time.sleep(RETRY_S)

    def _list(self) -> str:
        resp = self._call("list jobs", self._batch.list_namespaced_job, self.namespace,
                          label_selector=self.selector, _preload_content=False)  # fmt: skip
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        self._jobs = {j["metadata"]["name"]: j for j in body["items"]}
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, rv: str) -> str | None:
        """Follow one watch request; the resourceVersion to resume from, None to list again."""
        resp = self._call(
            "watch jobs", self._batch.list_namespaced_job, self.namespace,
            label_selector=self.selector, watch=True, resource_version=rv,
            allow_watch_bookmarks=True, timeout_seconds=WATCH_S, _preload_content=False,
            _request_timeout=(10, WATCH_S + 30),
        )  # fmt: skip
        try:
            for event in watch_events(resp):
                rv = self._apply(event, rv)
                if not rv or self._idle():
                    return None
        finally:
            resp.release_conn()
        return rv

    def _apply(self, event: dict[str, Any], rv: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # 410 Gone: our resourceVersion is too old
            return ""
        meta = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED"):
            self._jobs[meta["name"]] = obj
        elif kind == "DELETED":
            self._jobs.pop(meta["name"], None)
        return str(meta.get("resourceVersion") or rv)


def watch_events(resp: Any) -> Iterator[dict[str, Any]]:
    """The events of a watch answer read with ``_preload_content=False``: one JSON object per
    line, decoded as plain dicts (the client's own ``Watch`` builds model objects)."""
    buf = b""
    for chunk in resp.stream(1 << 16):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
