"""Remote mode of the CLI (``mlops_gpu.remote``): ``login``, and ``submit``, ``status``,
``queue``, ``cancel``, ``update``, ``history``, ``logs``, ``nodes`` and ``report`` against a
``mlops-gpu server``, printing what local mode prints. In remote mode no config is read and no
store is opened; the run's user is the token's."""

from __future__ import annotations

import json
from typing import Any

import click

from mlops_gpu.cli.safe_text import visible


def remote_target(ctx: click.Context) -> Any:
    """The server this command talks to, or None (local mode)."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.remote.credentials import CredentialsError, target

    try:
        return target(ctx.obj.get("config"))
    except CredentialsError as e:
        raise UserError(str(e)) from None


def client(t: Any) -> Any:
    from mlops_gpu.remote import Client

    return Client(t)


def failing(e: Exception) -> click.ClickException:
    from mlops_gpu.cli.common import UserError

    return UserError(str(e))


@click.command()
@click.argument("url")
@click.option("--token", prompt=True, hide_input=True, help="The token `users add` printed.")
def login(url: str, token: str) -> None:
    """Store URL and TOKEN (~/.config/mlops-gpu/credentials, mode 0600) after checking them:
    later commands talk to that server."""
    from mlops_gpu.remote import Client, RemoteError, Target, save

    t = Target(url.rstrip("/"), token.strip())
    try:
        with Client(t) as c:
            me = c.whoami()
    except RemoteError as e:
        raise failing(e) from None
    path = save(t)
    click.echo(visible(f"logged in to {t.url} as {me['name']}" + (" (admin)" if me["admin"]
               else "") + f"; credentials in {path}"))  # fmt: skip


def submit(t: Any, body: dict[str, Any], as_json: bool) -> None:
    from mlops_gpu.remote import RemoteError

    try:
        with client(t) as c:
            run = c.submit(body)
    except RemoteError as e:
        raise failing(e) from None
    click.echo(json.dumps(run) if as_json else run.get("array_id") or run["id"])


def hold(t: Any, run_ids: tuple[str, ...], held: bool) -> None:
    from mlops_gpu.remote import RemoteError

    try:
        with client(t) as c:
            for rid in run_ids:
                done = c.hold(rid, held)["runs"]
                if list(done) == [rid]:
                    click.echo(visible(f"{rid}: {done[rid]}"))
                else:  # an array id: one line, as local mode prints
                    n = sum(1 for what in done.values() if what in ("held", "released"))
                    verb = "held" if held else "released"
                    click.echo(f"{rid}: {n} of {len(done)} elements {verb}")
    except RemoteError as e:
        raise failing(e) from None


def _warn_if_none(c: Any) -> None:
    from mlops_gpu.cli.scheduler_cmd import NO_SCHEDULER

    try:
        running = c.scheduler()["running"]
    except Exception:  # a view must not fail on this hint
        return
    if not running:
        click.echo(f"mlops-gpu: {NO_SCHEDULER}", err=True)


def _whose(c: Any, user: str | None, mine: bool) -> str | None:
    """``--user``/``--mine`` remotely: ``--mine`` is the token's user."""
    from mlops_gpu.cli.common import whose

    return whose(user, mine, lambda: c.whoami()["name"])


def queue(t: Any, project: str | None, as_json: bool, user: str | None = None,
          mine: bool = False, expand: bool = True) -> None:  # fmt: skip
    from mlops_gpu.cli.render import public_runs_table
    from mlops_gpu.remote import RemoteError

    try:
        with client(t) as c:
            runs = c.queue(project, _whose(c, user, mine))
            if as_json:
                click.echo(json.dumps(runs, indent=2))
            else:
                public_runs_table(runs, title=f"Queue: {len(runs)} pending", with_reason=True,
                                  expand=expand)  # fmt: skip
            _warn_if_none(c)
    except RemoteError as e:
        raise failing(e) from None


def status(
    t: Any, run_ids: tuple[str, ...], project: str | None, limit: int | None, events: bool,
    as_json: bool, user: str | None = None, mine: bool = False, expand: bool = True,
) -> None:  # fmt: skip
    from mlops_gpu.cli.render import events_table, public_runs_table
    from mlops_gpu.remote import RemoteError

    try:
        with client(t) as c:
            who = _whose(c, user, mine)
            if run_ids:
                runs = [r for rid in run_ids for r in _get_many(c, rid, events)]
                runs = [r for r in runs if who in (None, r["user"])]
            else:
                runs = list(c.runs(project=project, limit=limit, user=who))
                if events:
                    runs = [c.get(r["id"], events=True) for r in runs]
            if as_json:
                click.echo(json.dumps(runs, indent=2))
            else:
                shown = [{k: v for k, v in r.items() if k != "events"} for r in runs]
                public_runs_table(shown, title="Runs", with_reason=True, expand=expand or events)
                for r in runs if events else ():
                    events_table(r["id"], [_Event(e) for e in r["events"]])
            _warn_if_none(c)
    except RemoteError as e:
        raise failing(e) from None


class _Event:
    """An event as the server sends it, read as ``events_table`` reads a store event."""

    def __init__(self, e: dict[str, Any]) -> None:
        from datetime import datetime

        self.time = datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
        self.kind, self.phase_from, self.phase_to = e["kind"], e["phase_from"], e["phase_to"]
        self.attempt, self.reason, self.lost_gpu_s = e["attempt"], e["reason"], e["lost_gpu_s"]


def _get(c: Any, run_id: str, events: bool) -> dict[str, Any]:
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.remote import RemoteError

    try:
        return dict(c.get(run_id, events=events))
    except RemoteError as e:
        if e.status in (404, 422):  # unknown, not visible, or not a run id: as local mode says
            raise UserError(f"no run with id {run_id!r}") from None
        raise


def _get_many(c: Any, run_or_array: str, events: bool) -> list[dict[str, Any]]:
    """The run, or an array's elements in index order (as local mode's ``_ids_of``)."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.remote import RemoteError

    try:
        return [dict(c.get(run_or_array, events=events))]
    except RemoteError as e:
        if e.status not in (404, 422):
            raise
    # (the server's pages are newest first; an array whose elements are all hidden is unknown)
    elements = list(c.runs(array_id=run_or_array))[::-1]
    if not elements:
        raise UserError(f"no run with id {run_or_array!r}") from None
    return [dict(c.get(r["id"], events=True)) for r in elements] if events else elements


def cancel(t: Any, run_ids: tuple[str, ...]) -> None:
    from mlops_gpu.remote import RemoteError

    try:
        with client(t) as c:
            for rid in run_ids:
                try:
                    got = c.cancel(rid)
                except RemoteError as e:
                    if e.status in (404, 422):  # as ``_get`` says it, and local mode
                        _get(c, rid, False)
                    raise
                # an array id: a line per element, as local mode prints
                for eid, what in (got.get("runs") or {rid: got["result"]}).items():
                    click.echo(f"{eid}: {what}")
    except RemoteError as e:
        raise failing(e) from None


def logs(t: Any, run_id: str, attempt: int | None, follow: bool) -> int:
    """``logs`` as in local mode (``cli.logs``): the bytes as the run wrote them; the same line
    and status when the attempt has no logs yet."""
    import sys

    from mlops_gpu.remote import RemoteError

    try:
        with client(t) as c:
            run = _get(c, run_id, False)
            stream = c.logs(run_id, attempt, follow)
            files = next(stream)
            if files == 0 and not follow:
                why = run["phase"] + (f": {visible(run['reason'], 500)}" if run["reason"] else "")
                print(f"mlops-gpu: run {run_id} attempt {attempt or run['attempt']} has no logs "
                      f"yet ({why})", file=sys.stderr)  # fmt: skip
                return 0 if run["phase"] == "pending" else 1
            for chunk in stream:
                assert isinstance(chunk, bytes)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
    except RemoteError as e:
        raise failing(e) from None
    return 0


def nodes(t: Any, as_json: bool) -> None:
    from mlops_gpu.cli.render import nodes_table
    from mlops_gpu.remote import RemoteError

    try:
        with client(t) as c:
            rows = c.nodes()
    except RemoteError as e:
        raise failing(e) from None
    if as_json:  # (as local mode: without the table's state_reason)
        click.echo(json.dumps([{k: v for k, v in r.items() if k != "state_reason"}
                               for r in rows], indent=2))  # fmt: skip
    else:
        nodes_table(rows)


def update(t: Any, run_id: str, changes: dict[str, Any], as_json: bool) -> None:
    """``update`` remotely: only the fields given travel (``PATCH /api/v1/runs/{id}``)."""
    from mlops_gpu.cli.common import array_lines
    from mlops_gpu.remote import RemoteError

    body = {k: v for k, v in changes.items() if v is not None}
    try:
        with client(t) as c:
            try:
                out = c.update(run_id, body)
            except RemoteError as e:
                if e.status in (404, 422):  # unknown: as local mode says it
                    _get_many(c, run_id, False)
                raise
    except RemoteError as e:
        raise failing(e) from None
    if "runs" in out:  # an array id
        for line in array_lines(out["elements"], out["runs"], as_json):
            click.echo(visible(line))
        return
    click.echo(json.dumps(out["run"]) if as_json else visible(f"{run_id}: {out['result']}"))


def history(t: Any, since: float, project: str | None, user: str | None, mine: bool,
            limit: int) -> list[dict[str, Any]]:  # fmt: skip
    """``history`` rows from ``GET /api/v1/history`` (the server shows only projects the
    token's user has a role in)."""
    from mlops_gpu.model.public import iso
    from mlops_gpu.remote import RemoteError

    try:
        with client(t) as c:
            params: dict[str, Any] = {"since": iso(since), "limit": limit}
            who = _whose(c, user, mine)
            params.update({k: v for k, v in (("project", project), ("user", who)) if v})
            return [dict(r) for r in c.history(params)]
    except RemoteError as e:
        raise failing(e) from None


def report(t: Any, by: str, since: float | None) -> dict[str, Any]:
    """``report``'s data from the server (the runs of projects the identity sees)."""
    from datetime import datetime, timezone

    from mlops_gpu.remote import RemoteError

    params: dict[str, Any] = {"by": by}
    if since is not None:
        params["since"] = datetime.fromtimestamp(since, tz=timezone.utc).isoformat()
    try:
        with client(t) as c:
            return dict(c.call("GET", "/report", params=params))
    except RemoteError as e:
        raise failing(e) from None
