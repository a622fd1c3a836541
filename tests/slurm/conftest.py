"""The real Slurm cluster for ``slurm``-marked tests: ``scripts/slurm.sh start`` (idempotent: a
cluster already up, as ``.ci/run`` leaves it, is reused). Where it cannot start, the tests skip,
unless ``MLOPS_GPU_REQUIRE_SLURM`` is set (CI), where they fail."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm_conf() -> Iterator[str]:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm.sh"), "start"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [x for x in proc.stdout.splitlines() if x.startswith("SLURM_CONF=")]
    if proc.returncode != 0 or not lines:
        msg = f"scripts/slurm.sh could not start Slurm: {(proc.stderr or proc.stdout)[-800:]}"
        if os.environ.get("MLOPS_GPU_REQUIRE_SLURM"):
            pytest.fail(msg)
        pytest.skip(msg)
    conf = lines[-1].split("=", 1)[1]
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf  # for the tests' own sinfo/scontrol calls
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
