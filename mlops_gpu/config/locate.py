"""Finding and loading the config file.

Search order (DESIGN.md): ``--config``, else ``MLOPS_GPU_CONFIG``, else ``./mlops-gpu.yaml``,
else the per-user config dir (``$XDG_CONFIG_HOME/mlops-gpu/mlops-gpu.yaml``, by default under
``~/.config``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mlops_gpu.config.schema import Config

FILE_NAME = "mlops-gpu.yaml"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that rejects a key given twice in one mapping (YAML would keep the last)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # unhashable keys are rejected by the schema anyway
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class ConfigError(ValueError):
    """A config problem, as one line: ``FILE: key.path: what was expected``."""


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
    if (
        len(parts) > 2
        and parts[0] == "backends"
        and parts[2] in ("local", "fake", "slurm", "kubernetes")
    ):
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
    try:
        text = found.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{found}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{found}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{found}: not valid UTF-8 (byte {e.start})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{found}: malformed YAML: {where}{problem}") from None
    return parse_config(data, str(found), found.resolve().parent)
