"""Slurm's array syntax (``--array 0-99%8``): ranges ``A-B``, lists ``1,3,5``, steps ``A-B:S``,
and ``%N`` for at most N elements running at once.

Invariants: ``parse_array`` returns the indices sorted and distinct, each >= 0, at most
``max_size`` of them, or raises ``ValueError`` with one line naming ``--array`` and what was
expected; the work is bounded by ``max_size``, whatever numbers the text holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = re.compile(r"(\d{1,9})(?:-(\d{1,9})(?::(\d{1,9}))?)?")
#: What every array element's environment holds: its index.
INDEX_ENV = "MLOPS_GPU_ARRAY_INDEX"


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indices: tuple[int, ...]
    limit: int | None


def parse_array(text: str, max_size: int = 10_000) -> ArraySpec:
    expected = "expected indices like 0-99, 1,3,5 or 0-99:2, optionally %N"
    body, pct, limit_text = text.strip().partition("%")
    limit = None
    if pct:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ValueError(f"--array {text!r}: %N must be a positive integer ({expected})")
        limit = int(limit_text)
    seen: set[int] = set()
    for part in body.split(","):
        m = _PART.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"--array {text!r}: {part.strip()!r} is not an index or range "
                             f"({expected})")  # fmt: skip
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo:
            raise ValueError(f"--array {text!r}: range {lo}-{hi} ends before it starts")
        if step < 1:
            raise ValueError(f"--array {text!r}: step must be at least 1")
        if len(seen) + (hi - lo) // step + 1 > max_size:
            raise ValueError(f"--array {text!r}: more than max_array_size ({max_size}) "
                             "elements")  # fmt: skip
        seen.update(range(lo, hi + 1, step))
    return ArraySpec(tuple(sorted(seen)), limit)
