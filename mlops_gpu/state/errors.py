"""Errors of the state store."""


class ConflictError(RuntimeError):
    """The run is not in a phase that allows the requested change."""
