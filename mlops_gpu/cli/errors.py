"""The CLI's one-line errors for a broken environment.

Any verb that meets a ``SetupError`` (a store that is damaged, foreign, newer, read-only or
unreachable; a state folder that cannot be written) prints ``mlops-gpu: error: <the line>``,
which names the file (or URL, password hidden) and what to do, and exits 1: never a traceback.
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
        from mlops_gpu.state import SetupError

        try:
            return super().invoke(ctx)
        except SetupError as e:
            raise SetupFailure(str(e)) from None
