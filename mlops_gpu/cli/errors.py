"""The CLI's one-line errors for a broken environment.

Any verb that meets a ``SetupError`` (a store that is damaged, foreign, newer, read-only or
unreachable; a state folder that cannot be written) prints ``mlops-gpu: error: <the line>``,
which names the file (or URL, password hidden) and what to do, and exits 1: never a traceback.
So does a SQLite store whose write lock another process held past the busy timeout
(``state.connect.BUSY_TIMEOUT_S``).
"""

from __future__ import annotations

from typing import Any

import click

from mlops_gpu.cli.args import ArgsGroup


class SetupFailure(click.ClickException):
    """The environment's fault, not the input's: exit status 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"mlops-gpu: error: {self.format_message()}", err=True)


class SetupErrorsAsOneLine(ArgsGroup):
    """``ArgsGroup`` whose commands' ``SetupError`` becomes a one-line ``SetupFailure``."""

    def invoke(self, ctx: click.Context) -> Any:
        from sqlalchemy.exc import OperationalError

        from mlops_gpu.state import SetupError

        try:
            return super().invoke(ctx)
        except SetupError as e:
            raise SetupFailure(str(e)) from None
        except OperationalError as e:
            if "database is locked" not in str(e.orig):
                raise
            from mlops_gpu.state.connect import BUSY_TIMEOUT_S

            raise SetupFailure(
                f"{_store_of(ctx)} stayed locked by another process for {BUSY_TIMEOUT_S}s (a "
                "scheduler paused or stuck in a write? see `mlops-gpu scheduler status`); "
                "retry when it is free"
            ) from None


def _store_of(ctx: click.Context) -> str:
    """The store the command's config names (its URL without a password), else "the store"."""
    from mlops_gpu.config import load_config
    from mlops_gpu.state.open_check import display

    try:
        url = load_config((ctx.obj or {}).get("config")).store_url
    except Exception:  # only a name for the message; the lock is the error
        return "the store"
    return display(url)
