"""Errors of the state store."""


class ConflictError(RuntimeError):
    """The run is not in a phase that allows the requested change."""


class LeadershipLost(RuntimeError):
    """A scheduler's write was refused: another scheduler took over its lease (fencing)."""
