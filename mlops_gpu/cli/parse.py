"""Parsing of CLI values: durations and KEY=VALUE pairs."""

from __future__ import annotations

import re

import click

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, flag: str) -> float:
    """``"90"``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1.5d"`` -> seconds (positive)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m:
        raise click.BadParameter(
            f"expected a duration such as 90s, 10m, 2h or 1d, got {text!r}", param_hint=flag
        )
    value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if value <= 0:
        raise click.BadParameter(f"must be positive, got {text!r}", param_hint=flag)
    return value


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {p!r}", param_hint="--env")
        out[key] = value
    return out
