"""The core's engine a replay runs on (``simulate --engine``, the openb packing replay): the
native one (``engines.native``, Rust) where the install built it, else the Python reference
(``engines.reference.FromScratch``: the same decisions, a snapshot per cycle, much slower).

``ENGINES`` are the choices; ``ENGINE_ALIASES`` the former names still accepted. The native
engine takes every config and shape prior, so only its absence falls back (``auto``) or
fails (``native``)."""

from __future__ import annotations

from mlops_gpu.core.snapshot import Snapshot
from mlops_gpu.engines import native
from mlops_gpu.engines.reference import FromScratch

ENGINES = ("auto", "reference", "native")
#: former names of the engines, still accepted
ENGINE_ALIASES = {"python": "reference"}


def core_engine(template: Snapshot, choice: str, missing: str) -> FromScratch | native.NativeEngine:
    """The engine ``choice`` names for ``template``; ``missing``: the ``NotSupported``
    message where ``native`` is asked for and the extension is not installed."""
    choice = ENGINE_ALIASES.get(choice, choice)
    if choice not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {choice!r}")
    module = None if choice == "reference" else native.installed()
    if module is not None:
        return native.NativeEngine(template, module)
    if choice == "native":
        raise native.NotSupported(missing)
    return FromScratch(template)
