"""Group-committed submits (``server.submits``): a run whose backend's folder cannot be written
fails its own request only (503); the other runs of its batch are stored. (A run naming no
backend needs every backend's folders, so the good runs here name ``local``.)

The config has the local backend and a Slurm backend (the real test cluster) whose
``shared_dir`` lies under a regular file, so it cannot be created, even by root."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import start_service

from mlops_gpu.testing import config_yaml
from team.conftest import Server

pytestmark = [pytest.mark.slurm]
GOOD = {"command": ["true"], "project": "p", "gpus": 1, "backend": "local"}
BAD = {**GOOD, "backend": "hpc"}


@pytest.fixture
def slurm_extra(tmp_path: Path) -> dict[str, Any]:
    conf = start_service("slurm.sh", "Slurm", "MLOPS_GPU_REQUIRE_SLURM", 900, key="SLURM_CONF")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    local = yaml.safe_load(config_yaml())["backends"]["local"]
    return {"backends": {
        "local": local,
        "hpc": {"type": "slurm", "cluster": "test", "slurm_conf": conf, "inventory_s": 0,
                "gres_types": {"a100-80gb": "a100"}, "shared_dir": str(blocker / "shared")},
    }}  # fmt: skip


def test_one_batch_with_an_unwritable_backend_folder(
    tmp_path: Path, slurm_extra: dict[str, Any]
) -> None:
    """The batch's write itself (deterministic: one call, three specs)."""
    from mlops_gpu.controller import Runtime
    from mlops_gpu.server.submits import Submit, submit_writer
    from mlops_gpu.state import SetupError
    from team.conftest import team_config

    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(team_config(f"sqlite:///{tmp_path / 'state.db'}", slurm_extra))
    rt = Runtime.load(cfg)
    gc = submit_writer(rt)
    try:
        specs = [rt.spec(("true",), project="p", user="mem", backend=b)
                 for b in ("local", "hpc", "local")]  # fmt: skip
        out = gc.write([Submit(s) for s in specs])
        assert [type(x).__name__ for x in out] == ["Run", "SetupError", "Run"]
        assert isinstance(out[1], SetupError) and "a-file" in str(out[1])
        assert len(rt.store.list_runs()) == 2
    finally:
        gc.close()
        rt.close()


def test_concurrent_submits_fail_only_the_unwritable_one(
    make_server: Callable[..., Server], slurm_extra: dict[str, Any]
) -> None:
    srv = make_server(None, "--no-scheduler", extra=slurm_extra)
    results: dict[int, httpx.Response] = {}
    gate = threading.Barrier(24)

    def submit(i: int) -> None:
        with srv.client("mem") as c:
            gate.wait(30)
            results[i] = c.post("/api/v1/runs", json=BAD if i % 8 == 3 else GOOD)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    bad = {i for i in range(24) if i % 8 == 3}
    for i, r in sorted(results.items()):
        if i in bad:
            assert r.status_code == 503, r.text
        else:
            assert r.status_code == 201, (i, r.text)
    assert len(results) == 24
    assert srv.counts()[0] == 24 - len(bad)
