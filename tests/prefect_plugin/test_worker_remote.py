"""The ``mlops-gpu`` Prefect worker in remote mode: a worker whose environment names a
``mlops-gpu server`` (``MLOPS_GPU_URL``, ``MLOPS_GPU_TOKEN``) queues flow runs there, under the
token's identity, and follows them to the end, with no config and no store of its own (its
``MLOPS_GPU_CONFIG`` points at a file it cannot read)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from team.conftest import Server, make_server, no_5xx  # noqa: F401 - the fixture

from .conftest import PrefectSetup
from .test_worker import flow_run, until

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def test_a_remote_worker_runs_flow_runs_through_the_server(
    prefect_api: str,
    make_server: Callable[..., Server],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    srv = make_server()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    d = tmp_path / "prefect"
    d.mkdir()
    env = {"MLOPS_GPU_URL": srv.url, "MLOPS_GPU_TOKEN": srv.tokens["mem"],
           "MLOPS_GPU_CONFIG": str(locked / "mlops-gpu.yaml"), "MLOPS_GPU_USER": "root",
           "HOME": str(tmp_path / "worker-home")}  # fmt: skip
    s = PrefectSetup(prefect_api, d, srv.cfg, ["p"], gpus=1, worker_env=env)
    try:
        fid = s.run("p", 1)
        until(lambda: flow_run(prefect_api, fid)["state"]["type"] in ("COMPLETED", "FAILED",
              "CRASHED", "CANCELLED"), 180, "the flow run to end")  # fmt: skip
        fr = flow_run(prefect_api, fid)
        assert fr["state"]["type"] == "COMPLETED", fr["state"]
        run_id = fr["infrastructure_pid"]
        with srv.client("mem") as c:
            until(lambda: c.get(f"/api/v1/runs/{run_id}").json()["phase"] != "running", 30,
                  "the run to end")  # fmt: skip
            run = c.get(f"/api/v1/runs/{run_id}").json()
        assert (run["phase"], run["user"], run["project"]) == ("succeeded", "mem", "p")
        assert len(run["devices"]) == 1
        log = (d / "worker.log").read_text()
        assert f"Queued as mlops-gpu run {run_id} in project p" in log
        assert not (tmp_path / "worker-home" / ".config" / "mlops-gpu").exists()
    finally:
        s.close(scheduler=False)
        locked.chmod(0o700)
        print((d / "worker.log").read_text()[-3000:])
    no_5xx(srv)
