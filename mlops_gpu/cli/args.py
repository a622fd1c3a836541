"""The CLI's arguments: text only, and every refusal one line.

- An argument that is not valid UTF-8, or holds a NUL, is refused before any verb runs
  (``model.text`` says why: runs are stored as text). ``exec`` is the exception: it stores
  nothing and passes its command to ``execve`` as the bytes it was given. Everything after
  ``--`` of ``submit`` is checked too (it is stored as the run's command).
- click's usage errors (a bad number, an unknown option or verb, a missing argument) are one
  line, ``mlops-gpu: error: VERB: what was wrong (see mlops-gpu VERB --help)``, exit status 2,
  like every other bad input, instead of click's usage block.
"""

from __future__ import annotations

from typing import Any

import click

from mlops_gpu.cli.safe_text import visible
from mlops_gpu.model.text import text_problem

#: Verbs whose arguments are not stored and may be bytes.
BYTES_VERBS = frozenset({"exec"})
#: click's "no arguments: show the help" is not an error to rewrite (absent before click 8.2).
_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def argv_problem(args: list[str], verb: str | None) -> str | None:
    """The first argument that is not text, as a message, or None."""
    if verb in BYTES_VERBS:
        return None
    for a in args:
        problem = text_problem(a, f"argument '{visible(a, 80)}'")
        if problem is not None:
            return problem
    return None


def _one_line(e: click.UsageError) -> click.ClickException:
    from mlops_gpu.cli.common import UserError

    path = e.ctx.command_path if e.ctx is not None else "mlops-gpu"
    verb = path.split(" ", 1)[1] + ": " if " " in path else ""
    return UserError(f"{verb}{e.format_message()} (see {path} --help)")


class ArgsGroup(click.Group):
    """A group that refuses non-text arguments (``argv_problem``) before its verbs see them,
    and turns click's usage errors into the CLI's one-line error, exit status 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            rest = super().parse_args(ctx, args)
        except click.UsageError as e:
            if isinstance(e, _HELP):
                raise
            raise _one_line(e) from None
        # the verb and its arguments (click < 8.2 names the first list ``protected_args``)
        first = getattr(ctx, "_protected_args", None)
        sub = [*(ctx.protected_args if first is None else first), *ctx.args]
        verb = sub[0] if sub else None
        config = ctx.params.get("config")
        problem = argv_problem([config] if config else [], None) or argv_problem(sub, verb)
        if problem is not None:
            from mlops_gpu.cli.common import UserError

            raise UserError(problem)
        return rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            if isinstance(e, _HELP):
                raise
            raise _one_line(e) from None
