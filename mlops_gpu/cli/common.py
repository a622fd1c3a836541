"""What every verb of the CLI shares: the one-line user error, the runtime of ``--config``, run
and array ids, and the ``--user``/``--mine`` views.

Invariants: this module imports no other verb's module (only ``safe_text``), so that any verb
may import it and ``main`` may import every verb: the CLI's modules form no import cycle (the
``acyclic_siblings`` contract in ``pyproject.toml``). Heavy imports (the controller, the store)
happen inside the functions that need them, so ``mlops-gpu --help`` stays fast.
"""

from __future__ import annotations

import json
from typing import Any

import click

from mlops_gpu.cli.safe_text import visible


class UserError(click.ClickException):
    """Bad input: one line on stderr (``mlops-gpu: error: ...``), exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"mlops-gpu: error: {visible(self.format_message())}", err=True)


def open_runtime(ctx: click.Context) -> Any:
    """The ``Runtime`` of the config ``--config`` names (else the usual lookup)."""
    from mlops_gpu.config import ConfigError
    from mlops_gpu.controller import Runtime

    try:
        return Runtime.load(ctx.obj["config"])
    except ConfigError as e:
        raise UserError(str(e)) from None


def ids_of(rt: Any, run_or_array: str) -> list[str]:
    """The run, or an array's elements (``status``, ``cancel``, ``hold``, ``release``)."""
    from mlops_gpu.state.jobs import expand_ids

    try:
        return expand_ids(rt.store, [run_or_array])
    except KeyError:
        raise UserError(f"no run with id {run_or_array!r}") from None


def whose(user: str | None, mine: bool, me: Any) -> str | None:
    """The user a view is limited to: ``--user NAME``, ``--mine`` (``me()``: the current
    identity), or None (everyone's)."""
    if user is not None and mine:
        raise UserError("--user and --mine: give one of them, not both")
    if user is not None and not user.strip():
        raise UserError("--user: expected a user name, got an empty one")
    return str(me()) if mine else user


def local_me() -> str:
    """The current identity in local mode: ``MLOPS_GPU_USER``, else the OS user."""
    from mlops_gpu.controller.runtime import current_user

    return current_user()


def user_options(f: Any) -> Any:
    """``--user NAME`` and ``--mine`` on a view."""
    f = click.option("--mine", is_flag=True, help="Only my runs ($MLOPS_GPU_USER or the OS "
                     "user; remotely the token's user).")(f)  # fmt: skip
    return click.option("--user", "-u", "user", default=None, help="Only this user's runs.")(f)


def array_lines(elements: list[dict[str, Any]], what: dict[str, str], as_json: bool) -> list[str]:
    """What ``update ARRAY_ID`` prints, locally and remotely: the elements as JSON, or a line
    per element saying what happened to it."""
    if as_json:
        return [json.dumps(elements)]
    return [f"{e['id']}: {what[e['id']]}" for e in elements]
