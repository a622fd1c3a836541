"""The real Slurm cluster for ``slurm``-marked tests: ``scripts/slurm.sh start`` (idempotent: a
cluster already up, as ``.ci/run`` leaves it, is reused). Where it cannot start, the tests skip,
unless ``MLOPS_GPU_REQUIRE_SLURM`` is set (CI), where they fail."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import start_service

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm_conf() -> Iterator[str]:
    conf = start_service("slurm.sh", "Slurm", "MLOPS_GPU_REQUIRE_SLURM", 900, key="SLURM_CONF")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf  # for the tests' own sinfo/scontrol calls
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
