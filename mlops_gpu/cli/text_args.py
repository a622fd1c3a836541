"""The CLI takes text arguments: one that is not valid UTF-8, or holds a NUL, is refused with a
one-line error before any verb runs (``model.text`` says why: runs are stored as text).

``exec`` is the exception: it stores nothing and passes its command to ``execve`` as the bytes
it was given. Everything after ``--`` of ``submit`` is checked too (it is stored as the run's
command).
"""

from __future__ import annotations

import click

from mlops_gpu.cli.safe_text import visible
from mlops_gpu.model.text import text_problem

#: Verbs whose arguments are not stored and may be bytes.
BYTES_VERBS = frozenset({"exec"})


def argv_problem(args: list[str], verb: str | None) -> str | None:
    """The first argument that is not text, as a message, or None."""
    if verb in BYTES_VERBS:
        return None
    for a in args:
        problem = text_problem(a, f"argument '{visible(a, 80)}'")
        if problem is not None:
            return problem
    return None


class TextArgsGroup(click.Group):
    """A group that refuses non-text arguments (``argv_problem``) with the CLI's one-line
    error, exit status 2, before its verbs see them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        # the verb and its arguments (click < 8.2 names the first list ``protected_args``)
        first = getattr(ctx, "_protected_args", None)
        sub = [*(ctx.protected_args if first is None else first), *ctx.args]
        verb = sub[0] if sub else None
        config = ctx.params.get("config")
        problem = argv_problem([config] if config else [], None) or argv_problem(sub, verb)
        if problem is not None:
            from mlops_gpu.cli.main import UserError

            raise UserError(problem)
        return rest
