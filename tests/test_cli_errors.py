"""CLI errors: bad input exits 2 with one ``mlops-gpu: error:`` line naming the field, and
writes nothing; a good submit prints only the run id and queues a run with the public keys."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_cli

from mlops_gpu.config import load_config
from mlops_gpu.state import Store

# fmt: off
PUBLIC_KEYS = {
    "id", "name", "project", "user", "priority", "phase", "gpus", "num_nodes", "gpu_fraction",
    "mig", "gpu_type", "backend", "node_names", "devices", "attempt", "submitted_at",
    "started_at", "finished_at", "reason_code", "reason", "eta", "array_id", "array_index",
}
# fmt: on
RUN_ID = re.compile(r"^r[0-9a-f]{10}$")


def cli(cfg_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--config", str(cfg_path), *args)


def submit(cfg_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    project = [] if "--project" in flags else ["--project", "p"]
    return cli(cfg_path, "submit", "--no-start", *project, *flags, "--", "echo", "hi")


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a bad-input exit (status 2)."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mlops-gpu: error: ")
    return lines[0]


def stored_runs(cfg_path: Path) -> int:
    store = Store(load_config(cfg_path).store_url)
    try:
        return store.count()
    finally:
        store.close()


# -- bad submits --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        pytest.param(["--gpus", "0"], "gpus", id="gpus-zero"),
        pytest.param(["--gpus", "0", "--cpu", "1000", "--nodes", "2"], "nodes", id="cpu-gang"),
        pytest.param(["--cpu", "-5"], "cpu_milli", id="cpu-negative"),
        pytest.param(["--gpus", "-2"], "gpus", id="gpus-negative"),
        pytest.param(["--project", "nope"], "project", id="unknown-project"),
        pytest.param(["--gpu-type", "h100"], "gpu_type", id="unknown-gpu-type"),
        pytest.param(["--gpus", "5"], "gpus", id="more-gpus-than-any-node"),
        pytest.param(["--priority", "urgent"], "priority", id="unknown-priority"),
        pytest.param(["--max-runtime", "banana"], "--max-runtime", id="bad-duration"),
        pytest.param(["--env", "NOEQUALS"], "--env", id="env-without-equals"),
        pytest.param(["--signal", "SIGFOO"], "--signal", id="unknown-signal"),
        pytest.param(["--nodes", "2"], "nodes", id="gang-on-single-node-backend"),
    ],
)
def test_bad_submit_is_one_line_and_writes_nothing(
    cfg_path: Path, flags: list[str], field: str
) -> None:
    proc = submit(cfg_path, *flags)
    assert field in one_error_line(proc)
    assert proc.stdout == ""
    assert stored_runs(cfg_path) == 0
    assert json.loads(cli(cfg_path, "status", "--json").stdout) == []


# -- bad config files ---------------------------------------------------------------------

BAD_FILES = [
    pytest.param(lambda text: text + "bogus_key: 1\n", "bogus_key: unknown key", id="unknown-key"),
    pytest.param(
        lambda text: text.replace("price_per_hour", "price_per_hr"),
        "gpu_types.a100-80gb.price_per_hr: unknown key",
        id="unknown-nested-key",
    ),
    pytest.param(
        lambda text: "store: [unclosed\nfoo: 1\n", "malformed YAML: line 2", id="malformed-yaml"
    ),
]
VERBS = [
    pytest.param(["submit", "--no-start", "--project", "p", "--", "echo", "hi"], id="submit"),
    pytest.param(["queue"], id="queue"),
    pytest.param(["status"], id="status"),
]


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(("spoil", "names"), BAD_FILES)
def test_config_error_exits_2_and_creates_no_store(
    cfg_path: Path, spoil: Callable[[str], str], names: str, verb: list[str]
) -> None:
    cfg_path.write_text(spoil(cfg_path.read_text()))
    line = one_error_line(cli(cfg_path, *verb))
    assert f"{cfg_path}: " in line and names in line
    assert sorted(p.name for p in cfg_path.parent.iterdir()) == [cfg_path.name]


def test_non_utf8_config_is_a_one_line_error(cfg_path: Path) -> None:
    cfg_path.write_bytes(b'store: "\xff\xfe"\n')
    line = one_error_line(cli(cfg_path, "queue"))
    assert str(cfg_path) in line


# -- unknown run ids ----------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["logs", "cancel", "status"])
def test_unknown_run_id_is_one_line_naming_it(cfg_path: Path, verb: str) -> None:
    line = one_error_line(cli(cfg_path, verb, "r0123456789"))
    assert "r0123456789" in line


# -- a good submit ------------------------------------------------------------------------


def test_good_submit_prints_the_id_and_queues_a_pending_run(cfg_path: Path) -> None:
    proc = submit(cfg_path, "--gpus", "2", "--name", "train-1")
    assert proc.returncode == 0, proc.stderr
    assert RUN_ID.match(proc.stdout.rstrip("\n")) and proc.stdout.count("\n") == 1
    run_id = proc.stdout.strip()

    queued = cli(cfg_path, "queue", "--json")
    assert queued.returncode == 0, queued.stderr
    (run,) = json.loads(queued.stdout)
    assert set(run) == PUBLIC_KEYS
    assert run["id"] == run_id
    assert (run["phase"], run["project"], run["name"]) == ("pending", "p", "train-1")
    assert (run["gpus"], run["num_nodes"], run["attempt"]) == (2, 1, 1)
    assert (run["node_names"], run["devices"], run["started_at"]) == ([], [], None)
    assert stored_runs(cfg_path) == 1


def test_a_cpu_only_submit_is_queued_with_its_host_request(cfg_path: Path) -> None:
    proc = submit(cfg_path, "--gpus", "0", "--cpu", "2000", "--memory", "4096")
    assert proc.returncode == 0, proc.stderr
    store = Store(load_config(cfg_path).store_url)
    try:
        (run,) = store.list_runs()
    finally:
        store.close()
    req = run.request
    assert (req.shape, req.gpus, req.cpu_milli, req.host_memory_mb) == ("cpu", 0, 2000, 4096)
