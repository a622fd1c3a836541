"""Config files are read with bounds (``config.bounded``): a file over 1 MiB, nesting deeper than
64 levels, aliases that expand past 200,000 values or into a cycle, and values PyYAML cannot
build are each one ``ConfigError`` line naming the file, in under a second; aliases within the
bounds still work."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from mlops_gpu.config import ConfigError, load_config
from mlops_gpu.testing import config_yaml


def lol(levels: int = 9) -> str:
    """The "billion laughs": 10**levels values from a few hundred bytes."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


HOSTILE: dict[str, tuple[Callable[[str], str], str]] = {
    "10-MB": (lambda good: good + "#" * 10_000_000 + "\n", "too large (over 1 MiB)"),
    "just-over-1-MiB": (lambda good: good + "#" * (1 << 20) + "\n", "too large"),
    "deep-flow": (lambda good: "store: " + "[" * 100 + "]" * 100 + "\n", "nested more than 64"),
    "deep-flow-5000": (lambda good: "store: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
    "deep-block": (
        lambda good: "".join(f"{'  ' * i}k{i}:\n" for i in range(300)) + "  " * 300 + "v: 1\n",
        "nested more than 64",
    ),
    "billion-laughs": (lambda good: lol(), "aliases expand to more than 200,000"),
    "laughs-in-a-key": (lambda good: lol(6) + "store: *a6\n", "aliases expand"),
    "alias-cycle": (lambda good: "store: &x [a, *x]\n", "alias *x is inside the node it names"),
    "bad-date": (lambda good: good + "when: 2024-02-30\n", "a value cannot be read"),
    "huge-int": (lambda good: good + "n: " + "9" * 5000 + "\n", "a value cannot be read"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_config_is_one_line_naming_the_file_in_under_a_second(
    tmp_path: Path, name: str
) -> None:
    spoil, expected = HOSTILE[name]
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(spoil(config_yaml()))
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    elapsed = time.perf_counter() - t0
    message = str(info.value)
    assert message.startswith(f"{cfg}: ") and expected in message, message
    assert "\n" not in message
    assert elapsed < 1.0, f"{name}: refused after {elapsed:.2f} s"


def test_deep_nesting_is_bounded_without_libyaml_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyYAML's own (pure Python) parser: the bound, not a RecursionError, refuses it."""
    from mlops_gpu.config import bounded

    monkeypatch.setattr(bounded, "_BaseLoader", yaml.SafeLoader)
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text("store: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
        load_config(cfg)


def test_aliases_within_the_bounds_still_work(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(
        "gpu_types: {a100-80gb: {price_per_hour: 1.0}}\n"
        "backends: {local: {type: local, nodes: [{name: n, gpu_type: a100-80gb, gpus: 4}]}}\n"
        "projects:\n"
        "  p: {quotas: {a100-80gb: &q {nominal: 2, borrowing_limit: 0}}}\n"
        "  q: {quotas: {a100-80gb: *q}}\n"
    )
    assert load_config(cfg).projects["q"].quotas["a100-80gb"].nominal == 2


def test_the_cli_refuses_a_deep_config_with_exit_2_and_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text("store: " + "[" * 3000 + "]" * 3000 + "\n")
    proc = run_cli("--config", str(cfg), "queue")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"mlops-gpu: error: {cfg}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlops-gpu.yaml"]  # no store made
