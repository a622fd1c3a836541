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
        r = self._request(method, path, **kw)
        try:
            return r.json()
        except ValueError:
            raise RemoteError(f"{self.target.url}: not an mlops-gpu server (no JSON answer)") \
                from None  # fmt: skip

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise RemoteError(f"cannot reach the server {self.target.url}: {e}") from None
        if r.status_code >= 400:
            self._raise(r)
        return r

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

    def submit_call(self, body: dict[str, Any]) -> dict[str, Any]:
        """Submit a callable (``body["payload"]``: base64 of its cloudpickle)."""
        return dict(self.call("POST", "/runs/call", json=body, timeout=600.0))

    def result(self, run_id: str) -> bytes:
        """A callable run's pickled value."""
        return bytes(self._request("GET", f"/runs/{run_id}/result", timeout=600.0).content)

    def settings(self) -> dict[str, Any]:
        return dict(self.call("GET", "/settings"))

    def get(self, run_id: str, events: bool = False, mlflow: bool = False) -> dict[str, Any]:
        """The run; with ``events`` its events, with ``mlflow`` the MLflow run of its current
        attempt (``mlflow_run_id``, null when none)."""
        params = {"events": "true"} if events else {}
        if mlflow:
            params["mlflow"] = "true"
        return dict(self.call("GET", f"/runs/{run_id}", params=params))

    def runs(
        self,
        *,
        project: str | None = None,
        limit: int | None = None,
        user: str | None = None,
        array_id: str | None = None,
    ) -> Iterator[Any]:
        """Runs newest first, page by page (``limit``: at most that many; ``array_id``: only
        that array's elements)."""
        cursor, n = None, 0
        while True:
            page_size = min(1000, limit - n) if limit is not None else 1000
            if page_size <= 0:
                return
            params: dict[str, Any] = {"limit": page_size}
            if project is not None:
                params["project"] = project
            if user is not None:
                params["user"] = user
            if array_id is not None:
                params["array_id"] = array_id
            if cursor is not None:
                params["cursor"] = cursor
            page = self.call("GET", "/runs", params=params)
            for run in page["runs"]:
                n += 1
                yield run
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def queue(self, project: str | None = None, user: str | None = None) -> list[Any]:
        params = {k: v for k, v in (("project", project), ("user", user)) if v is not None}
        return list(self.call("GET", "/queue", params=params))

    def update(self, run_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """``PATCH /runs/{id}``: {"id", "phase", "result", "run"}."""
        return dict(self.call("PATCH", f"/runs/{run_id}", json=changes))

    def history(self, params: dict[str, Any]) -> list[Any]:
        return list(self.call("GET", "/history", params=params))

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

    def top(self, queue: int, nodes: int) -> dict[str, Any]:
        """One ``top`` frame's data (``controller.top_data``)."""
        return dict(self.call("GET", "/top", params={"queue": queue, "nodes": nodes}))

    def scheduler(self) -> dict[str, Any]:
        return dict(self.call("GET", "/scheduler"))
