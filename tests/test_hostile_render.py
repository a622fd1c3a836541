"""Hostile strings in every view: rich markup, ANSI/OSC escapes, C1 controls, bidi overrides
and 100 KB values in run names, projects, users, nodes, GPU types, priority classes and the
reasons that quote them are shown literally by every table (``safe_text``: no ``MarkupError``,
nothing a terminal acts on, long values cut with a note) and exactly by every ``--json``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from mlops_gpu.cli.main import cli
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import ResourceRequest

BIG = "B" * 100_000
NAMES = {
    "markup": "[/bold]",
    "markup2": "[bold red]loud[/] [link=http://x]y[/link] :smile: \\[x]",
    "osc": "\x1b]0;pwned\x07title",
    "csi": "\x1b[2J\x1b[31mred",
    "bidi": "safe\u202eexe.txt \u2066x\u2069",
    "c1": "\x9b31m\x85nel\x7f",
    "lines": "two\nlines\r\tx",
    "big": BIG,
}
PROJECT = "[/p]\x1b]0;t\x07\u202e"
NODE = "[/n]\x1b[2J"
GPU = "[/g]\x9b"
PRIO = "[/prio]\x1b[5m"
USER = "u\x1b[2J" + "U" * 100_000
#: characters that must never reach a terminal raw
RAW = ["\x1b", "\x07", "\x9b", "\x85", "\x7f", "\r", "\t", "\u202e", "\u2066", "\u2069"]
#: how they must show instead
SHOWN = ["[/bold]", "\\x1b]0;pwned\\x07title", "\\x1b[2J", "\\u202e", "\\x9b31m", "two\\nlines"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fake-backend cluster whose names are hostile, with one run per hostile name: some
    finished (in the usage ledger), some running, some pending with reasons."""
    d = tmp_path_factory.mktemp("hostile")
    cfg = d / "mlops-gpu.yaml"
    data = {
        "store": "sqlite:///state.db",
        "state_dir": "state",
        "gpu_types": {GPU: {"price_per_hour": 1.0}},
        "backends": {
            "fake": {
                "type": "fake",
                "duration_s": 0,
                "nodes": [{"name": NODE, "gpu_type": GPU, "gpus": 4}],
            }
        },
        "projects": {PROJECT: {"quotas": {GPU: {"nominal": 4}}}},
        "priority_classes": {PRIO: 50, "normal": 100},
        "scheduler": {"tick_s": 0.1},
    }
    cfg.write_text(yaml.safe_dump(data))
    mp = pytest.MonkeyPatch()
    mp.setenv("MLOPS_GPU_USER", USER)
    rt = Runtime.load(cfg)
    ids = {}
    for key, name in NAMES.items():
        spec = rt.spec(
            ("echo", name),
            project=PROJECT,
            name=name,
            priority=PRIO if key == "markup" else None,
            request=ResourceRequest(gpus=4),
            experiment=name,
        )
        ids[key] = rt.submit(spec).id
    ctl = Controller(rt)
    ctl.acquire()
    try:
        for _ in range(3):
            ctl.tick()
    finally:
        ctl.release()
        rt.close()
    yield cfg, ids
    mp.undo()


def invoke(cfg: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--config", str(cfg), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 0, result.output
    # stdout only: stderr may carry a hint ("no scheduler is running"), never inside --json
    return result.stdout


def visible(text: str) -> str:
    from mlops_gpu.cli.safe_text import visible as shown

    return shown(text)


def assert_literal(out: str) -> None:
    for ch in RAW:
        assert ch not in out, f"raw {ch!r} reached the terminal"
    assert BIG not in out and USER not in out
    assert len(out) < 60_000  # the 100 KB values are cut


VIEWS = [
    pytest.param(["queue"], id="queue"),
    pytest.param(["status"], id="status"),
    pytest.param(["status", "--all", "--events"], id="status-all-events"),
    pytest.param(["nodes"], id="nodes"),
    pytest.param(["report"], id="report"),
    pytest.param(["report", "--by", "user"], id="report-by-user"),
    pytest.param(["report", "--by", "gpu_type"], id="report-by-gpu-type"),
    pytest.param(["history", "--since", "3650d"], id="history"),
]


@pytest.mark.parametrize("view", VIEWS)
def test_every_table_view_shows_hostile_strings_literally(
    hostile: tuple[Path, dict[str, str]], view: list[str]
) -> None:
    cfg, _ = hostile
    out = invoke(cfg, *view)
    assert_literal(out)
    if view[0] == "status":
        for shown in SHOWN:
            assert shown in out, (shown, out[:3000])
    if view[0] in ("queue", "status"):
        assert "[/bold]" in out and "BBBB…(+99" in out and "--json shows them whole" in out
    if view[0] in ("queue", "status", "nodes"):
        assert visible(NODE) in out or view[0] == "queue"
        assert visible(PROJECT) in out or view[0] == "nodes"
    if view == ["report"]:
        assert visible(PROJECT) in out
    if view[0] == "history":  # (15 columns: the project folds onto a second line)
        assert visible(PROJECT)[:11] in out and "(+999" in out
    if view == ["report", "--by", "user"]:
        assert "u\\x1b[2JUUU" in out and "…(+" in out


def test_status_events_show_reasons_that_quote_hostile_names(
    hostile: tuple[Path, dict[str, str]],
) -> None:
    cfg, ids = hostile
    out = invoke(cfg, "status", ids["csi"], "--events")
    assert_literal(out)
    assert "placed on [/n]\\x1b[2J" in out  # the event reason names the hostile node


def test_logs_header_shows_the_reason_literally(hostile: tuple[Path, dict[str, str]]) -> None:
    cfg, ids = hostile
    out = CliRunner().invoke(cli, ["--config", str(cfg), "logs", ids["big"]])
    assert out.exception is None or isinstance(out.exception, SystemExit)
    assert_literal(out.output)


def _values(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _values(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _values(v)


@pytest.mark.parametrize(
    "view",
    [
        ["queue", "--json"],
        ["status", "--all", "--events", "--json"],
        ["nodes", "--json"],
        ["report", "--format", "json", "--by", "user"],
        ["history", "--since", "3650d", "--json"],
    ],
    ids=["queue", "status-events", "nodes", "report", "history"],
)
def test_json_views_give_every_value_exactly(
    hostile: tuple[Path, dict[str, str]], view: list[str]
) -> None:
    cfg, _ = hostile
    out = invoke(cfg, *view)
    assert "\x1b" not in out and "\u202e" not in out  # JSON escapes them (ensure_ascii)
    values = set(_values(json.loads(out)))
    if view[0] == "nodes":
        assert {NODE, GPU} <= values
    elif view[0] == "report":
        assert USER in values
    elif view[0] == "history":
        assert {PROJECT, USER} <= values and set(NAMES.values()) & values
    else:
        assert {PROJECT, USER} <= values
        assert set(NAMES.values()) & values


def test_status_json_round_trips_every_name(hostile: tuple[Path, dict[str, str]]) -> None:
    cfg, ids = hostile
    runs = json.loads(invoke(cfg, "status", *ids.values(), "--json"))
    assert [r["name"] for r in runs] == list(NAMES.values())


# -- the function itself ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("[/bold]", "[/bold]"),
        ("\x1b]0;t\x07", "\\x1b]0;t\\x07"),
        ("a\u202eb\u2066c\u2069\u200f\u061c", "a\\u202eb\\u2066c\\u2069\\u200f\\u061c"),
        ("\x00\x85\x9f\x7f", "\\x00\\x85\\x9f\\x7f"),
        ("a\nb\r\tc", "a\\nb\\r\\tc"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("\udcff", "\\xff"),  # a byte that was not UTF-8 (surrogateescape)
        ("\ud800", "\\ud800"),
        ("日本語 é 👩‍💻", "日本語 é 👩‍💻"),  # printable text and joiners unchanged
    ],
)
def test_visible_escapes_what_a_terminal_acts_on(raw: str, shown: str) -> None:
    assert visible(raw) == shown


def test_visible_cuts_long_values_and_says_so() -> None:
    from mlops_gpu.cli.safe_text import visible

    assert visible("x" * 1000, 10) == "x" * 10 + "…(+990 chars)"
    assert visible("x" * 10, 10) == "x" * 10


def test_a_cell_is_never_markup() -> None:
    from rich.console import Console

    from mlops_gpu.cli.safe_text import cell

    c = Console(width=80, file=open("/dev/null", "w"), record=True)  # noqa: SIM115
    c.print(cell("[/bold] [red]x[/red] :smile:"))
    assert c.export_text().strip() == "[/bold] [red]x[/red] :smile:"


def test_scheduler_log_lines_show_names_literally() -> None:
    import logging

    from mlops_gpu.cli.daemon import _VisibleFormatter

    record = logging.LogRecord("mlops_gpu", logging.INFO, __file__, 1, "started %s on %s",
                               ("evil\x1b[2J\nnext", "[/n]\u202e"), None)  # fmt: skip
    line = _VisibleFormatter("%(levelname)s %(message)s").format(record)
    assert line == "INFO started evil\\x1b[2J\\nnext on [/n]\\u202e"
