"""Finding and loading the config file.

Search order (DESIGN.md): ``--config``, else ``MLOPS_GPU_CONFIG``, else ``./mlops-gpu.yaml``,
else the per-user config dir (``$XDG_CONFIG_HOME/mlops-gpu/mlops-gpu.yaml``, by default under
``~/.config``). Reading the YAML (its bounds, duplicate keys) is ``config.bounded``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mlops_gpu.config.bounded import ConfigError, load_yaml
from mlops_gpu.config.registry import backend_types
from mlops_gpu.config.schema import Config

__all__ = ["ConfigError", "find_config", "load_config", "parse_config", "user_config_path"]

FILE_NAME = "mlops-gpu.yaml"


def user_config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mlops-gpu" / FILE_NAME


def find_config(
    explicit: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """The config path to use, or None when there is none anywhere (explicit paths are returned
    even when missing, so that loading them names the missing file)."""
    env = os.environ if environ is None else environ
    if explicit:
        return Path(explicit)
    if env.get("MLOPS_GPU_CONFIG"):
        return Path(env["MLOPS_GPU_CONFIG"])
    for candidate in (Path.cwd() / FILE_NAME, user_config_path(env)):
        if candidate.is_file():
            return candidate
    return None


def _loc(loc: tuple[Any, ...]) -> str:
    # pydantic puts the backend's discriminator tag after its name (backends.NAME.TAG.key):
    # drop the tag, which is not a key of the file.
    parts = [str(p) for p in loc]
    if len(parts) > 2 and parts[0] == "backends" and parts[2] in backend_types():
        del parts[2]
    return ".".join(parts) or "(top level)"


def parse_config(data: Any, source: str = "<config>", root: Path | None = None) -> Config:
    if data is None:
        raise ConfigError(f"{source}: the file is empty; run `mlops-gpu init` for a starter")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: (top level): expected a mapping of keys, got {type(data).__name__}"
        )
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            elif msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            loc = _loc(err["loc"])
            problems.append(msg if loc == "(top level)" and ": " in msg else f"{loc}: {msg}")
        # One line, always: keys and values echoed from the file may hold line breaks.
        text = "; ".join(problems).replace("\r", "\\r").replace("\n", "\\n")
        raise ConfigError(f"{source}: {text}") from None
    return cfg.bind(Path(source) if source != "<config>" else None, root or Path.cwd())


def load_config(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Config:
    found = find_config(path, environ)
    if found is None:
        raise ConfigError(
            f"no config found (--config, MLOPS_GPU_CONFIG, ./{FILE_NAME}, "
            f"{user_config_path(environ)}); run `mlops-gpu init` to write one"
        )
    data = load_yaml(found)  # bounded: size, depth, aliases (config.bounded)
    return parse_config(data, str(found), found.resolve().parent)
