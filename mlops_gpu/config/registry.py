"""The backend types the config accepts: the built-ins plus the ``mlops_gpu.backends`` entry
point group, so that a backend installed as a package needs no edit here or anywhere else.

A plugin's distribution declares, in its pyproject::

    [project.entry-points."mlops_gpu.backends"]
    echo = "mlops_gpu_echo:EchoBackendConfig"

where ``EchoBackendConfig`` subclasses ``mlops_gpu.config.BackendConfigBase`` with
``type: Literal["echo"]`` and a ``builder`` (``config.backends`` says what those are).

Invariants:
- Read once per process (the config's union is built from it when ``config.schema`` is
  imported): a backend installed later is seen by the next process.
- The built-ins are always there, with or without installed metadata (a checkout run from
  source, an install made before the group existed); this package's own pyproject registers
  the same four, and an entry point may not give a built-in name to another class.
- An entry point that cannot be loaded, or is not a backend model named after its entry point,
  stops the import with ``BackendRegistryError`` naming the entry point and its distribution:
  a config naming that type could not be read anyway, and a silent drop would hide why.
- Loading an entry point imports the model's module only (no backend, no SDK).
"""

from __future__ import annotations

import typing
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from mlops_gpu.config.backends import (
    BackendConfigBase,
    FakeBackendConfig,
    KubernetesBackendConfig,
    LocalBackendConfig,
    SlurmBackendConfig,
)

GROUP = "mlops_gpu.backends"

#: The built-in backends, exactly as pyproject registers them in ``GROUP``.
BUILTIN: dict[str, type[BackendConfigBase]] = {
    "local": LocalBackendConfig,
    "fake": FakeBackendConfig,
    "slurm": SlurmBackendConfig,
    "kubernetes": KubernetesBackendConfig,
}


class BackendRegistryError(RuntimeError):
    """An entry point of ``mlops_gpu.backends`` that does not name a usable backend model."""


def _where(ep: EntryPoint) -> str:
    dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
    return f"entry point {GROUP}: {ep.name} = {ep.value} (from {dist})"


def type_name(cls: type[BackendConfigBase]) -> str | None:
    """The name a backend model's ``type: Literal["<name>"]`` field holds, if it is one."""
    field = cls.model_fields.get("type")
    if field is None or typing.get_origin(field.annotation) is not typing.Literal:
        return None
    args = typing.get_args(field.annotation)
    return args[0] if len(args) == 1 and isinstance(args[0], str) else None


def _load(ep: EntryPoint) -> type[BackendConfigBase]:
    try:
        obj = ep.load()
    except Exception as e:  # a plugin's import error, whatever it is, is reported as its own
        raise BackendRegistryError(f"{_where(ep)}: cannot be loaded: {e!r}") from e
    if ep.name in BUILTIN:
        if obj is BUILTIN[ep.name]:
            return obj  # this package's own registration
        raise BackendRegistryError(
            f"{_where(ep)}: {ep.name!r} is a built-in backend type; choose another name"
        )
    if not (isinstance(obj, type) and issubclass(obj, BackendConfigBase)):
        raise BackendRegistryError(
            f"{_where(ep)}: expected a subclass of mlops_gpu.config.BackendConfigBase, got {obj!r}"
        )
    if type_name(obj) != ep.name:
        raise BackendRegistryError(
            f"{_where(ep)}: {obj.__name__}.type must be Literal[{ep.name!r}]"
            f" (the entry point's name), got {obj.model_fields['type'].annotation!r}"
        )
    if not obj.builder or ":" not in obj.builder:
        raise BackendRegistryError(
            f"{_where(ep)}: {obj.__name__}.builder must name the function that makes the"
            f" backend as 'module:function', got {obj.builder!r}"
        )
    return obj


@cache
def backend_types() -> dict[str, type[BackendConfigBase]]:
    """Every backend type by name: the built-ins first, then the plugins sorted by name."""
    found = dict(BUILTIN)
    plugins: dict[str, type[BackendConfigBase]] = {}
    for ep in entry_points(group=GROUP):
        cls = _load(ep)
        if ep.name in plugins and plugins[ep.name] is not cls:
            raise BackendRegistryError(
                f"{_where(ep)}: backend type {ep.name!r} is registered twice, also as"
                f" {plugins[ep.name].__module__}.{plugins[ep.name].__qualname__}"
            )
        if ep.name not in BUILTIN:
            plugins[ep.name] = cls
    found.update(sorted(plugins.items()))
    return found
