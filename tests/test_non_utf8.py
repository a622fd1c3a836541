"""Arguments that are not valid UTF-8 (argv is bytes on POSIX; Python hands them over as
surrogateescape strings) are refused with one line naming the byte, before anything is stored
(SQLite and PostgreSQL text cannot hold them); ``exec``, which stores nothing, passes them on as
the same bytes. The SDK refuses them (and NUL characters) with a ``SubmitError``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_cli, stored

import mlops_gpu as mg
from mlops_gpu.controller import SubmitError

BAD = os.fsdecode(b"\xff\xfe")  # "\udcff\udcfe": what Python makes of those argv bytes


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlops-gpu: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--", "echo", BAD], id="command"),
        pytest.param(["--name", "x" + BAD, "--", "echo"], id="name"),
        pytest.param(["--env", "K=" + BAD, "--", "echo"], id="env"),
        pytest.param(["--experiment", BAD, "--", "echo"], id="experiment"),
    ],
)
def test_a_non_utf8_submit_is_one_line_and_stores_nothing(cfg_path: Path, args: list[str]) -> None:
    proc = run_cli("--config", str(cfg_path), "submit", "--no-start", "-p", "p", *args)
    line = one_line(proc)
    assert "not valid UTF-8 (byte 0xff" in line and "\\xff\\xfe" in line
    assert stored(cfg_path) == 0


@pytest.mark.parametrize("verb", [["status"], ["cancel"], ["logs"], ["queue", "-p"]])
def test_read_verbs_refuse_a_non_utf8_argument(cfg_path: Path, verb: list[str]) -> None:
    assert "not valid UTF-8" in one_line(run_cli("--config", str(cfg_path), *verb, "r" + BAD))


def test_a_non_utf8_working_directory_is_refused_naming_workdir(cfg_path: Path) -> None:
    odd = cfg_path.parent / ("dir" + BAD)
    odd.mkdir()
    proc = run_cli("--config", str(cfg_path), "submit", "--no-start", "-p", "p", "--", "echo",
                   cwd=odd)  # fmt: skip
    assert "workdir is not valid UTF-8 (byte 0xff" in one_line(proc)
    ok = run_cli("--config", str(cfg_path), "submit", "--no-start", "-p", "p",
                 "--workdir", str(cfg_path.parent), "--", "echo", cwd=odd)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert stored(cfg_path) == 1


def test_exec_passes_non_utf8_arguments_on_as_the_same_bytes(tmp_path: Path) -> None:
    code = "import os, sys; sys.stdout.buffer.write(os.fsencode(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-m", "mlops_gpu.cli.main", "exec", "--", sys.executable, "-c", code,
         b"a\xff\xfe"],
        capture_output=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "MLFLOW_TRACKING_URI": f"file://{tmp_path}/mlruns"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"a\xff\xfe"


@pytest.fixture(params=["sqlite", "postgresql"])
def sdk_cfg(request: pytest.FixtureRequest, cfg_path: Path) -> Path:
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_store_url")
        data = yaml.safe_load(cfg_path.read_text())
        data["store"] = url
        cfg_path.write_text(yaml.safe_dump(data))
    return cfg_path


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        pytest.param({"target": ["echo", BAD]}, "command argument 2", id="command"),
        pytest.param({"target": "echo", "name": BAD}, "name", id="name"),
        pytest.param({"target": "echo", "name": "a\x00b"}, "name contains a NUL", id="nul-name"),
        pytest.param({"target": "echo", "env": {"K": "\x00"}}, "env 'K' contains a NUL", id="env"),
        pytest.param({"target": "echo", "workdir": "/tmp/" + BAD}, "workdir", id="workdir"),
    ],
)
def test_sdk_refuses_what_the_store_cannot_hold(
    sdk_cfg: Path, kwargs: dict[str, object], names: str
) -> None:
    with pytest.raises(SubmitError, match=names):
        mg.submit(project="p", config=str(sdk_cfg), start_scheduler=False, **kwargs)  # type: ignore[arg-type]
    assert stored(sdk_cfg) == 0
    run = mg.submit("echo ok", project="p", config=str(sdk_cfg), start_scheduler=False)
    assert stored(sdk_cfg) == 1 and run.status == "pending"
