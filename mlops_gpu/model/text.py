"""Which strings a run may hold: text (valid UTF-8) without NUL characters.

The rule (README, "Names and commands"): mlops-gpu stores every string of a run as text (SQLite
and PostgreSQL ``TEXT``, JSON) and hands the command to backends that take text (Slurm scripts,
Kubernetes manifests). A POSIX argv or path is bytes, which Python decodes with
``surrogateescape``: a byte that is not UTF-8 becomes a lone surrogate (``\\udcff``), which no
text store can hold, and a NUL cannot reach ``exec`` nor PostgreSQL. Such a string is refused at
submit, naming the field and the byte, rather than stored altered; ``mlops-gpu exec`` (which
stores nothing) passes its command through as bytes.

Invariants:
- ``text_problem`` is None exactly when ``value.encode("utf-8")`` succeeds and ``value`` holds
  no NUL.
- ``spec_text_problems`` checks every string a ``RunSpec`` holds.
"""

from __future__ import annotations

from mlops_gpu.model.run import RunSpec


def text_problem(value: str, what: str) -> str | None:
    """Why ``value`` (named ``what`` in the message) cannot be stored, or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = value[e.start]
        # surrogateescape maps byte 0xNN to U+DCNN: name the byte the user passed
        byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else "a surrogate"
        return f"{what} is not valid UTF-8 ({byte} at character {e.start}); mlops-gpu stores text"
    if "\x00" in value:
        return f"{what} contains a NUL character (at character {value.index(chr(0))})"
    return None


def spec_text_problems(spec: RunSpec) -> list[str]:
    """``text_problem`` of every string ``spec`` holds (empty when it can be stored)."""
    r = spec.request
    fields: list[tuple[str | None, str]] = [
        (spec.name, "name"),
        (spec.project, "project"),
        (spec.user, "user"),
        (spec.priority, "priority"),
        (r.mig, "mig"),
        (r.topology_key, "topology key"),
        (spec.experiment, "experiment"),
        (spec.workdir, "workdir"),
        (spec.backend, "backend"),
        (spec.checkpoint.signal, "signal"),
    ]
    fields += [(a, f"command argument {i + 1}") for i, a in enumerate(spec.command)]
    fields += [(t, "gpu type") for t in r.gpu_types]
    for k, v in spec.env.items():
        fields += [(k, "env name"), (v, f"env {k!r}")]
    return [p for v, what in fields if v is not None and (p := text_problem(v, what)) is not None]
