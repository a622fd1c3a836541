"""Errors of the state store.

``SetupError`` and its ``StoreError`` are the environment's faults, not the request's: a store
that is damaged, foreign, written by a newer mlops-gpu, read-only or unreachable, a state folder
that cannot be written. Their ``str()`` is one line naming the file (or the URL, password
hidden) and what to do, and nothing was written when they are raised.
"""

from __future__ import annotations


class ConflictError(RuntimeError):
    """The run is not in a phase that allows the requested change."""


class SetupError(RuntimeError):
    """The environment cannot be used as it is; the message is one line saying what to do."""


class StoreError(SetupError):
    """The store cannot be used: ``where`` (a path or a URL without its password) ``what``
    (the problem), then ``todo``."""

    def __init__(self, where: str, what: str, todo: str) -> None:
        super().__init__(f"{where} {what}: {todo}")
        self.where, self.what, self.todo = where, what, todo


class LeadershipLost(RuntimeError):
    """A scheduler's write was refused: another scheduler took over its lease (fencing)."""


class DependencyError(ValueError):
    """A submit names a dependency that cannot be: an unknown run or array id, or a cycle."""


class WriteRefused(RuntimeError):
    """A submit the store refused for a reason that is not the request's and that drawing new
    run ids would not cure (an audit row breaking a constraint); nothing of it was stored."""
