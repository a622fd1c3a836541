"""Reading a config file with bounds: its size, its nesting depth and what its YAML aliases
expand to, each refused with one ``ConfigError`` line naming the file, in well under a second
(a hostile or mistaken file must not take minutes, memory or a 3,000-line ``RecursionError``).

Invariants:
- At most ``MAX_BYTES + 1`` bytes are read, whatever the file is (a FIFO, ``/dev/zero``).
- The YAML event stream is checked before any node is built: no collection deeper than
  ``MAX_DEPTH``, no alias inside the node it names (a cycle), and at most ``MAX_NODES`` nodes
  once aliases are expanded ("billion laughs": nine aliases deep, 10**9 nodes from 1 KB).
  PyYAML's composer recurses per level, so the depth bound also keeps it off the stack limit.
- A key given twice in one mapping is refused (YAML would keep the last).
- libyaml's parser is used where PyYAML has it (about 30x faster), else PyYAML's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config problem, as one line: ``FILE: key.path: what was expected``."""


MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 200_000

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(_BaseLoader):  # type: ignore[misc]
    """A safe YAML loader that rejects a key given twice in one mapping."""

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


def read_text(path: Path) -> str:
    """The file's text, refused when over ``MAX_BYTES``, unreadable or not UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(
            f"{path}: too large (over {MAX_BYTES / 2**20:g} MiB); a config file is at most "
            f"{MAX_BYTES / 2**20:g} MiB"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid UTF-8 (byte {e.start})") from None


def _at(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""


def check_shape(text: str, source: str) -> None:
    """Refuse (``ConfigError``) nesting deeper than ``MAX_DEPTH``, an alias cycle, or more than
    ``MAX_NODES`` nodes with aliases expanded; YAML syntax errors raise ``yaml.YAMLError``."""
    # per open collection: [nodes so far (itself included), its anchor]
    stack: list[list[Any]] = []
    sizes: dict[str, int] = {}  # anchor -> expanded node count of the node it names
    done = 0  # nodes of closed top-level collections and top-level scalars
    for event in yaml.parse(text, Loader=_BaseLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise ConfigError(f"{source}: {_at(event)}nested more than {MAX_DEPTH} levels deep")
            stack.append([1, event.anchor])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            n, anchor = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            n, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            if any(a == event.anchor for _, a in stack):
                raise ConfigError(
                    f"{source}: {_at(event)}alias *{event.anchor} is inside the node it names "
                    "(a cycle)"
                )
            n, anchor = sizes.get(event.anchor or "", 1), None
            if done + n + sum(c for c, _ in stack) > MAX_NODES:
                raise ConfigError(
                    f"{source}: {_at(event)}YAML aliases expand to more than {MAX_NODES:,} "
                    "values; write the values out instead"
                )
        else:
            continue
        if anchor is not None:
            sizes[anchor] = n
        if stack:
            stack[-1][0] += n
        else:
            done += n


def load_yaml(path: Path) -> Any:
    """The file's YAML value, within the bounds above; every problem a one-line ConfigError."""
    text = read_text(path)
    try:
        check_shape(text, str(path))
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: malformed YAML: {where}{problem}") from None
    except ConfigError:
        raise
    except (ValueError, OverflowError) as e:
        # a scalar PyYAML resolves but cannot build: a date such as 2024-02-30, an integer of
        # more than 4,300 digits
        what = str(e).replace("\n", " ")
        raise ConfigError(f"{path}: malformed YAML: a value cannot be read: {what}") from None
