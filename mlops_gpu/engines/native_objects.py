"""Constructors, generated once per dataclass, that build the native engine's result objects
(``NodeSlot``, ``Placement``, ``Admission``, ``Preemption``, ``Decision``, and the copies of
the runs it admits or preempts) at about half the cost of the dataclasses' own ``__init__``
and ``dataclasses.replace``: a frozen dataclass's ``__init__`` sets each field through
``object.__setattr__``, ``replace`` goes through ``fields`` and ``__init__`` again; the code
generated here sets each slot directly through its member descriptor, on an object not yet
shared. At 50,000 runs these objects were most of ``NativeEngine.cycle``'s Python time.

Invariants: ``build(cls)(*values)`` equals ``cls(*values)`` for every value of every field
(positional, in field order: every field is an argument, defaults included), and
``copier(cls, names)(obj, *values)`` equals ``replace(obj, **dict(zip(names, values)))``; the
objects are of ``cls`` itself, as frozen, hashed and compared as the dataclass's own
(``tests/core/test_fast_copies.py`` compares them field by field). The fields are read from
the dataclass when the code is generated, so a field added later is set too. Only slotted
dataclasses without ``__post_init__`` are taken (nothing the generated code would skip).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, is_dataclass
from typing import Any


def _slots(cls: type) -> list[str]:
    """The fields of ``cls``, refused unless each is a slot and nothing runs after ``__init__``."""
    if not is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: __post_init__ would be skipped")
    return [f.name for f in fields(cls)]


def _compile(name: str, params: Sequence[str], cls: type, values: dict[str, str]) -> Any:
    """A function ``name(*params)`` returning a new ``cls`` whose field ``f`` is set to the
    expression ``values[f]`` (the setters are bound as globals of the generated code)."""
    names = _slots(cls)
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def {name}({', '.join(params)}):", "    o = _new(_cls)"]
    for k, f in enumerate(names):
        env[f"_set{k}"] = getattr(cls, f).__set__
        lines.append(f"    _set{k}(o, {values[f]})")
    lines.append("    return o")
    exec("\n".join(lines), env)  # (code made here, from the dataclass's own field names)
    return env[name]


def build(cls: type) -> Callable[..., Any]:
    """``cls(*values)``, every field given in order (see the module docstring)."""
    names = _slots(cls)
    params = [f"a{k}" for k in range(len(names))]
    return _compile("build", params, cls, dict(zip(names, params, strict=True)))  # type: ignore[no-any-return]


def copier(cls: type, changed: Sequence[str]) -> Callable[..., Any]:
    """``lambda obj, *values: replace(obj, **dict(zip(changed, values)))`` for ``cls``."""
    names = _slots(cls)
    unknown = set(changed) - set(names)
    if unknown:
        raise TypeError(f"{cls.__name__}: no field {sorted(unknown)}")
    params = [f"a{k}" for k in range(len(changed))]
    values = {f: f"obj.{f}" for f in names}
    values.update(zip(changed, params, strict=True))
    return _compile("copy", ["obj", *params], cls, values)  # type: ignore[no-any-return]
