"""Every CLI verb and the config loader under hypothesis-generated input (names, commands,
durations, numbers, unicode, control characters, markup, bytes that are not UTF-8): no
traceback ever, exit status 0, 1 or 2, every refusal one ``mlops-gpu: error:`` line with no raw
control character, nothing stored on a refused submit, and nothing a terminal acts on in any
human output. The CLI runs in-process (click's runner) on a fake backend, so nothing executes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from conftest import stored
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops_gpu.cli.main import cli
from mlops_gpu.config import ConfigError, load_config
from mlops_gpu.testing import config_yaml

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\r")
HOSTILE = [
    "[/bold]", "[red]x[/]", ":smile:", "\x1b]0;t\x07", "\x1b[2J", "a\u202eb", "\x9b1m", "\n",
    "-", "--", "-x", "--json", "", " ", "0", "-1", "1e309", "nan", "inf", "99999999999999999999",
    "10m", "1.5d", "0s", "p", "r0123456789", "SIGUSR1", "a100-80gb", "x" * 5000,
]  # fmt: skip
#: what argv can hold: any text, and bytes that are not UTF-8 (as Python decodes them)
words = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=30),
    st.binary(min_size=1, max_size=12).map(lambda b: os.fsdecode(b.replace(b"\0", b""))),
)
numbers = st.one_of(st.integers(1, 8).map(str), st.integers(-(10**20), 10**20).map(str), words)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fuzzed paths (init --path, submit --workdir) are relative to a scratch folder."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fake-backend config (nothing is ever run), one run already queued."""
    d = tmp_path_factory.mktemp("fuzz")
    data = yaml.safe_load(config_yaml())
    data["backends"] = {"local": {**data["backends"]["local"], "type": "fake"}}
    data["mlflow"] = {"enabled": False}
    path = d / "mlops-gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    result = invoke(path, "submit", "--no-start", "-p", "p", "--", "echo")
    assert result.exit_code == 0, result.output
    yield path


def invoke(cfg: Path, *args: str) -> Result:
    result = CliRunner().invoke(cli, ["--config", str(cfg), *args])
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), (args, result.exc_info)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    if result.exit_code != 0:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("mlops-gpu: "), (args, result.stderr)
    for ch in RAW:
        assert ch not in result.stderr, (args, result.stderr)
    if not (args and args[0] == "logs"):  # a run's logs are its own output
        for ch in RAW:
            assert ch not in result.stdout, (args, ch)
    return result


SUBMIT_FLAGS = {
    "--project": st.one_of(st.just("p"), words),
    "--gpus": numbers,
    "--nodes": numbers,
    "--gpu-type": words,
    "--gpu-fraction": numbers,
    "--gpu-memory": numbers,
    "--mig": words,
    "--cpu": numbers,
    "--memory": numbers,
    "--topology": words,
    "--priority": st.one_of(st.sampled_from(["low", "normal", "high"]), words),
    "--name": words,
    "--max-runtime": numbers,
    "--experiment": words,
    "--backend": words,
    "--signal": words,
    "--grace": numbers,
    "--env": words,
    "--workdir": words,
    "--max-attempts": numbers,
}


@st.composite
def submit_args(draw: st.DrawFn) -> list[str]:
    args = ["submit", "--no-start"]
    for flag in draw(st.lists(st.sampled_from(sorted(SUBMIT_FLAGS)), max_size=5)):
        args += [flag, draw(SUBMIT_FLAGS[flag])]
    if draw(st.booleans()):
        args += ["--json"]
    if draw(st.booleans()):
        args += ["--non-preemptible"]
    if "--project" not in args and draw(st.booleans()):
        args += ["-p", "p"]
    return [*args, "--", *draw(st.lists(words, max_size=3))]


@FUZZ
@given(args=submit_args())
def test_fuzz_submit(cfg: Path, args: list[str]) -> None:
    before = stored(cfg)
    result = invoke(cfg, *args)
    assert stored(cfg) == before + (result.exit_code == 0), (args, result.output)


@FUZZ
@given(
    verb=st.sampled_from(
        ["queue", "status", "logs", "cancel", "nodes", "report", "history", "update"]
    ),
    rest=st.lists(
        st.one_of(
            words,
            st.sampled_from(
                [
                    "--json",
                    "--all",
                    "--events",
                    "-p",
                    "--project",
                    "--limit",
                    "--attempt",
                    "--follow",
                    "--by",
                    "--since",
                    "--format",
                    "--plot",
                    "--user",
                    "--mine",
                    "--priority",
                    "--max-runtime",
                    "--gpus",
                    "project",
                    "user",
                    "gpu_type",
                    "day",
                    "json",
                    "csv",
                    "table",
                ]
            ),
        ),
        max_size=5,
    ),
)
def test_fuzz_read_verbs_and_cancel(cfg: Path, verb: str, rest: list[str]) -> None:
    if "--follow" in rest or "-f" in rest:
        rest = [a for a in rest if a not in ("--follow", "-f")]  # would wait for the run to end
    plot = [i for i, a in enumerate(rest) if a == "--plot"]
    for i in plot:  # a chart written anywhere but the test's folder: not here
        rest[i] = "--json"
    before = stored(cfg)
    invoke(cfg, verb, *rest)
    assert stored(cfg) == before


@FUZZ
@given(gpu_type=words, gpus=numbers, force=st.booleans(), name=words)
def test_fuzz_init_writes_a_config_that_loads_or_refuses(
    tmp_path: Path, gpu_type: str, gpus: str, force: bool, name: str
) -> None:
    path = tmp_path / "init" / "mlops-gpu.yaml"
    args = ["init", "--path", str(path), "--virtual-gpus", gpus, "--gpu-type", gpu_type]
    result = invoke(tmp_path / "unused.yaml", *args, *(["--force"] if force else []))
    if result.exit_code == 0:
        loaded = load_config(path)  # what init writes always loads, names exactly as given
        assert list(loaded.gpu_types) == [gpu_type]
        path.unlink()
    # a --path that is not a writable file: one line, no traceback
    invoke(tmp_path / "unused.yaml", "init", "--virtual-gpus", "1", "--path", name or "x/")


@FUZZ
@given(
    rest=st.lists(
        st.one_of(
            words,
            st.sampled_from(
                [
                    "--trace",
                    "--start",
                    "--days",
                    "--nodes",
                    "--gpus-per-node",
                    "--policy",
                    "--seed",
                    "--json",
                    "--engine",
                    "philly",
                    "openb",
                ]
            ),
        ),
        max_size=6,
    ),
)
def test_fuzz_simulate_arguments(tmp_path: Path, rest: list[str]) -> None:
    # a trace must not be replayed here (seconds each): --trace names a file that is not there
    args = ["simulate", *rest, "--trace", str(tmp_path / "none.csv"), "--plot", str(tmp_path)]
    result = invoke(tmp_path / "unused.yaml", *args)
    assert result.exit_code == 2


@settings(FUZZ, max_examples=15)
@given(rest=st.lists(st.one_of(words, st.sampled_from(["--idle-exit", "-v"])), max_size=4))
def test_fuzz_scheduler_flags(cfg: Path, rest: list[str]) -> None:
    invoke(cfg, "scheduler", "--once", *rest)


# -- the config loader --------------------------------------------------------------------

GOOD = config_yaml()
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
    st.sampled_from(HOSTILE),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def load_or_one_line(path: Path) -> None:
    try:
        load_config(path)
    except ConfigError as e:
        message = str(e)
        assert message.startswith(f"{path}: ") and "\n" not in message, message


@FUZZ
@given(text=st.one_of(st.text(max_size=300), st.binary(max_size=300).map(repr)))
def test_fuzz_config_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, errors="surrogateescape")
    load_or_one_line(path)


@FUZZ
@given(data=st.data())
def test_fuzz_config_values(tmp_path: Path, data: st.DataObject) -> None:
    """A valid config with a value replaced or a key added somewhere, at any depth."""
    cfg = yaml.safe_load(GOOD)
    node = cfg
    while isinstance(node, dict) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node)))
        if not isinstance(node[key], dict):
            break
        node = node[key]
    key = data.draw(st.one_of(st.sampled_from(sorted(node) or ["x"]), st.text(max_size=8)))
    node[key] = data.draw(values)
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(cfg))
    load_or_one_line(path)


@FUZZ
@given(at=st.integers(0, len(GOOD)), junk=st.one_of(st.text(max_size=20), st.sampled_from(
    ["&a", "*a", "*", "&", "<<: *a", ": :", "\t", "{", "[", "- ", "!!python/object:os.system",
     "!!binary", "? ", "---\n", "...", "%YAML 1.1\n", "\ufeff"]
)))  # fmt: skip
def test_fuzz_config_mutations(tmp_path: Path, at: int, junk: str) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(GOOD[:at] + junk + GOOD[at:])
    load_or_one_line(path)
