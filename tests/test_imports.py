"""Layering and import weight: lower layers never import higher ones and no package's modules
import one another in a cycle (import-linter, with checks that the contracts do catch a
violation), and ``import mlops_gpu`` stays light."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("prefect", "mlflow", "kubernetes", "pandas")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def test_import_contract_holds() -> None:
    r = lint_imports(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


@pytest.mark.parametrize(
    ("module", "line", "said"),
    [
        ("core/policy.py", "import mlops_gpu.state", "mlops_gpu.core.policy -> mlops_gpu.state"),
        # the pure core never reaches up to a stateful engine
        ("core/policy.py", "import mlops_gpu.engines.reference",
         "mlops_gpu.core.policy -> mlops_gpu.engines.reference"),
        # the MLflow clients sit below the store: the job's launcher loads them alone
        ("tracking/rest.py", "import mlops_gpu.state.store",
         "mlops_gpu.tracking.rest -> mlops_gpu.state.store"),
        ("cli/report.py", "from mlops_gpu.cli import main", "- .report -> .main"),  # a cycle
        ("state/schema.py", "import mlops_gpu.state.mlflow_notes",
         "- .schema -> .mlflow_notes"),
    ],
    ids=[
        "core-imports-state", "core-imports-engine", "mlflow-client-imports-store", "cli-cycle",
        "state-cycle",
    ],
)  # fmt: skip
def test_import_contracts_catch_a_violation(
    tmp_path: Path, module: str, line: str, said: str
) -> None:
    shutil.copytree(
        REPO / "mlops_gpu", tmp_path / "mlops_gpu", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "mlops_gpu" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    r = lint_imports(tmp_path)
    assert r.returncode != 0
    assert said in r.stdout


def imported_modules(code: str) -> set[str]:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    mods = set()
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            mods.add(line.rsplit("|", 1)[1].strip())
    return mods


@pytest.mark.parametrize(
    "code",
    ["import mlops_gpu", "import mlops_gpu.cli.main", "import mlops_gpu.core, mlops_gpu.model"],
    ids=["package", "cli", "core"],
)
def test_import_is_light(code: str) -> None:
    mods = imported_modules(code)
    assert mods, "importtime printed nothing"
    heavy = sorted(m for m in mods if m.split(".")[0] in HEAVY)
    assert heavy == []


def test_the_launcher_paths_import_no_scheduler() -> None:
    """``mlops-gpu exec`` starts in every job, dozens at once on a node: neither its CLI path
    nor the backends' entry point may pull in the store, the controller or SQLAlchemy."""
    for code in ("import mlops_gpu.cli.main", "import mlops_gpu.telemetry.launcher"):
        mods = imported_modules(code)
        assert not {m for m in mods if m.startswith(("mlops_gpu.controller", "mlops_gpu.state"))}
        assert not {m for m in mods if m.split(".")[0] in ("sqlalchemy", "pydantic", "yaml")}


def test_importtime_parser_sees_heavy_imports() -> None:
    # The check above is only meaningful if the parser would see such an import.
    assert "pandas" in imported_modules("import pandas")
