"""The core compiled with mypyc (``scripts/compiled_core.py``) is the same policy: the core's
and the simulator's tests pass against it, and on the throughput benchmark's workload it makes
exactly the decisions the Python core makes, cycle by cycle (a digest of every admission and
preemption)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import compiled_core  # noqa: E402
from conftest import core_bench  # noqa: E402


def test_the_compiled_core_decides_exactly_as_the_python_core() -> None:
    python, compiled = core_bench("--core", "installed"), core_bench("--core", "compiled")
    assert (python["core"], compiled["core"]) == ("python", "compiled")
    # (a cycle per completion of the 1,000 runs, some at the same moment; this workload
    # reports no checkpoints, so only reclaim preempts and adds none)
    assert python["cycles"] == compiled["cycles"] and python["cycles"] > 900
    assert python["preemptions"] == compiled["preemptions"]
    assert python["decisions_sha256"] == compiled["decisions_sha256"]


def test_the_core_and_simulator_tests_pass_against_the_compiled_core(tmp_path: Path) -> None:
    out = compiled_core.build()
    shutil.copytree(REPO / "tests", tmp_path / "tests",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    (tmp_path / "tests" / "core" / "test_zz_is_compiled.py").write_text(
        "import mlops_gpu.core.policy, mlops_gpu.model.run\n\n\n"
        "def test_these_tests_ran_compiled():\n"
        "    for m in (mlops_gpu.core.policy, mlops_gpu.model.run):\n"
        "        assert not m.__file__.endswith('.py'), m.__file__\n"
    )
    env = {**os.environ, "PYTHONPATH": str(out)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/core", "tests/test_core.py", "tests/sim"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
