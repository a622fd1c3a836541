"""``mlops-gpu server``, ``users`` and ``audit``: the team service and its identities, run where
the server's config is (they open its store directly).

``users add`` prints the new token once, as its last line: the store keeps only its hash."""

from __future__ import annotations

import json
import time
from typing import Any

import click


def _rt(ctx: click.Context) -> Any:
    from mlops_gpu.cli.common import open_runtime

    return open_runtime(ctx)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8265, show_default=True)
@click.option(
    "--certfile",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="TLS certificate (PEM); with --keyfile the server speaks HTTPS only.",
)
@click.option(
    "--keyfile",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="TLS private key (PEM).",
)
@click.option("--no-scheduler", is_flag=True,
              help="Serve the API only (another process schedules).")  # fmt: skip
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="API processes (the scheduler runs in this one).")  # fmt: skip
@click.pass_context
def server(
    ctx: click.Context,
    host: str,
    port: int,
    certfile: str | None,
    keyfile: str | None,
    no_scheduler: bool,
    workers: int,
) -> None:
    """Serve the REST API (/api/v1) for a team, with the scheduler beside it."""
    import sys

    from mlops_gpu.cli.common import UserError
    from mlops_gpu.server.serve import serve

    if (certfile is None) != (keyfile is None):
        raise UserError("--certfile and --keyfile go together")
    rt = _rt(ctx)
    sys.exit(serve(rt, host=host, port=port, certfile=certfile, keyfile=keyfile,
                   scheduler=not no_scheduler, workers=workers))  # fmt: skip


@click.group()
def users() -> None:
    """Users of `mlops-gpu server`: their tokens and project roles."""


def _ttl(expires: str | None, rt: Any) -> float:
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.cli.parse import parse_duration

    if expires is None:
        return float(rt.cfg.server.auth.token_days * 86400)
    try:
        return parse_duration(expires, "--expires")
    except click.BadParameter as e:
        raise UserError(e.format_message()) from None


@users.command(name="add")
@click.argument("name")
@click.option("--role", type=click.Choice(["admin"]), default=None, help="Make NAME an admin.")
@click.option(
    "--project",
    "projects",
    multiple=True,
    metavar="PROJECT:ROLE",
    help="A role (viewer, member, maintainer) in a project; repeat for more.",
)
@click.option(
    "--expires",
    default=None,
    metavar="DURATION",
    help="Token lifetime, e.g. 30d (default: the config's server.auth.token_days).",
)
@click.pass_context  # fmt: skip
def add(
    ctx: click.Context, name: str, role: str | None, projects: tuple[str, ...], expires: str | None
) -> None:
    """Create user NAME and print its token (once, as the last line)."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.state.users import ROLES, add_user
    from mlops_gpu.state.users import UserError as StoreUserError

    rt = _rt(ctx)
    if not name.strip() or len(name) > 200 or name != name.strip():
        raise UserError(f"NAME: expected 1 to 200 characters without surrounding spaces, "
                        f"got {name!r}")  # fmt: skip
    roles: dict[str, str] = {}
    for item in projects:
        project, sep, prole = item.rpartition(":")
        if not sep or not project or prole not in ROLES:
            raise UserError(f"--project: expected PROJECT:ROLE with ROLE one of "
                            f"{', '.join(ROLES)}, got {item!r}")  # fmt: skip
        if project not in rt.cfg.projects:
            raise UserError(f"--project: {project!r} is not a project of {rt.cfg.source}")
        roles[project] = prole
    ttl = _ttl(expires, rt)
    try:
        token = add_user(rt.store, name, admin=role == "admin", projects=roles, ttl_s=ttl)
    except StoreUserError as e:
        raise UserError(str(e)) from None
    what = ", ".join(f"{p}: {r}" for p, r in roles.items()) or "no project roles"
    click.echo(
        f"user {name} added ({'admin; ' if role else ''}{what}); token expires "
        f"{time.strftime('%Y-%m-%d', time.gmtime(time.time() + ttl))}, shown once:"
    )
    click.echo(token)


@users.command(name="token")
@click.argument("name")
@click.option("--expires", default=None, metavar="DURATION", help="Token lifetime, e.g. 30d.")
@click.pass_context
def token(ctx: click.Context, name: str, expires: str | None) -> None:
    """Give user NAME a new token (printed once, as the last line)."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.state.users import UserError as StoreUserError
    from mlops_gpu.state.users import add_token

    rt = _rt(ctx)
    try:
        click.echo(add_token(rt.store, name, ttl_s=_ttl(expires, rt)))
    except StoreUserError as e:
        raise UserError(str(e)) from None


@users.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print users as a JSON list.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Users with their roles (stored and from the config) and valid tokens."""
    from mlops_gpu.cli.safe_text import visible
    from mlops_gpu.config.server import ROLE_RANK
    from mlops_gpu.model.public import iso
    from mlops_gpu.state.users import list_users

    rt = _rt(ctx)
    rows: list[dict[str, Any]] = []
    for u in list_users(rt.store):
        roles = {p: c.members[u.name] for p, c in rt.cfg.projects.items() if u.name in c.members}
        for project, role in u.projects.items():  # the higher of the two wins, as in the server
            if ROLE_RANK[role] > ROLE_RANK.get(roles.get(project, ""), 0):
                roles[project] = role
        rows.append({"name": u.name, "admin": u.admin, "projects": roles,
                     "active_tokens": u.active_tokens, "expires_at": iso(u.expires_at),
                     "created_at": iso(u.created_at)})  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no users (add one with `mlops-gpu users add NAME`)")
    for r in rows:
        roles_text = ", ".join(f"{p}:{x}" for p, x in r["projects"].items()) or "-"
        click.echo(visible(f"{r['name']:<20} {'admin' if r['admin'] else '-':<6} "
                           f"tokens {r['active_tokens']} (until {r['expires_at'] or '-'})  "
                           f"{roles_text}"))  # fmt: skip


@users.command()
@click.argument("name")
@click.pass_context
def revoke(ctx: click.Context, name: str) -> None:
    """Revoke every token of user NAME (at once: the next request is refused)."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.state.users import UserError as StoreUserError
    from mlops_gpu.state.users import revoke as do_revoke

    rt = _rt(ctx)
    try:
        n = do_revoke(rt.store, name)
    except StoreUserError as e:
        raise UserError(str(e)) from None
    click.echo(f"user {name}: {n} token{'s' if n != 1 else ''} revoked")


@click.command()
@click.option("--since", default=None, metavar="DURATION", help="Only the last DURATION (e.g. 1d).")
@click.option("--user", default=None, help="Only this user's requests.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Newest entries shown.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print entries as a JSON list.")
@click.pass_context
def audit(
    ctx: click.Context, since: str | None, user: str | None, limit: int, as_json: bool
) -> None:
    """The server's audit trail: every mutating request, oldest first."""
    from mlops_gpu.cli.common import UserError
    from mlops_gpu.cli.parse import parse_duration
    from mlops_gpu.cli.safe_text import visible
    from mlops_gpu.model.public import iso
    from mlops_gpu.state import audit as trail

    try:
        start = time.time() - parse_duration(since, "--since") if since else None
    except click.BadParameter as e:
        raise UserError(e.format_message()) from None
    rows = trail.read(_rt(ctx).store, since=start, user=user, limit=limit)
    if as_json:
        click.echo(json.dumps([{**ev.to_dict(), "time": iso(ev.time)} for ev in rows], indent=2))
        return
    for ev in rows:
        click.echo(
            visible(
                f"{iso(ev.time)}  {ev.user or '-':<16} {ev.status}  {ev.action}  "
                f"{ev.target or '-'}  {ev.client or '-'}  {ev.detail or ''}".rstrip()
            )
        )
