"""A small HTTP client of the server's ``/api/v1`` (httpx): each call returns the JSON answer or
raises ``RemoteError``, one line with the server's own error message (``{"error": ...}``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mlops_gpu.remote.credentials import Target


class RemoteError(RuntimeError):
    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Client:
    def __init__(self, target: Target, timeout: float = 30.0) -> None:
        import httpx

        self.target = target
        self._http = httpx.Client(
            base_url=target.url + "/api/v1",
            headers={"Authorization": f"Bearer {target.token}"},
            timeout=timeout,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise RemoteError(f"cannot reach the server {self.target.url}: {e}") from None
        if r.status_code >= 400:
            self._raise(r)
        try:
            return r.json()
        except ValueError:
            raise RemoteError(f"{self.target.url}: not an mlops-gpu server (no JSON answer)") \
                from None  # fmt: skip

    def _raise(self, r: Any) -> None:
        try:
            err = r.json()["error"]
            msg, code = str(err["message"]), str(err["code"])
        except (ValueError, KeyError, TypeError):
            msg, code = r.text[:200] or r.reason_phrase, "error"
        raise RemoteError(f"{self.target.url}: {msg}", r.status_code, code)

    def whoami(self) -> dict[str, Any]:
        return dict(self.call("GET", "/whoami"))

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", "/runs", json=body))

    def get(self, run_id: str, events: bool = False) -> dict[str, Any]:
        params = {"events": "true"} if events else {}
        return dict(self.call("GET", f"/runs/{run_id}", params=params))

    def runs(self, *, project: str | None = None, limit: int | None = None) -> Iterator[Any]:
        """Runs newest first, page by page (``limit``: at most that many)."""
        cursor, n = None, 0
        while True:
            page_size = min(1000, limit - n) if limit is not None else 1000
            if page_size <= 0:
                return
            params: dict[str, Any] = {"limit": page_size}
            if project is not None:
                params["project"] = project
            if cursor is not None:
                params["cursor"] = cursor
            page = self.call("GET", "/runs", params=params)
            for run in page["runs"]:
                n += 1
                yield run
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def queue(self, project: str | None = None) -> list[Any]:
        return list(self.call("GET", "/queue", params={"project": project} if project else {}))

    def cancel(self, run_id: str) -> dict[str, Any]:
        return dict(self.call("POST", f"/runs/{run_id}/cancel"))

    def hold(self, run_id: str, held: bool) -> dict[str, Any]:
        """Hold (``held``) or release a run, or an array's elements."""
        return dict(self.call("POST", f"/runs/{run_id}/{'hold' if held else 'release'}"))

    def nodes(self) -> list[Any]:
        return list(self.call("GET", "/nodes"))

    def logs(self, run_id: str, attempt: int | None, follow: bool) -> Iterator[bytes | int]:
        """The log's bytes as they come, after the number of log files (an int, first)."""
        import httpx

        params: dict[str, Any] = {"follow": "true"} if follow else {}
        if attempt is not None:
            params["attempt"] = attempt
        try:
            with self._http.stream("GET", f"/runs/{run_id}/logs", params=params,
                                   timeout=None if follow else 30.0) as r:  # fmt: skip
                if r.status_code >= 400:
                    r.read()
                    self._raise(r)
                yield int(r.headers.get("x-log-files", "1"))
                yield from r.iter_bytes()
        except httpx.HTTPError as e:
            raise RemoteError(f"cannot reach the server {self.target.url}: {e}") from None

    def scheduler(self) -> dict[str, Any]:
        return dict(self.call("GET", "/scheduler"))
