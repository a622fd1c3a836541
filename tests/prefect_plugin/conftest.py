"""A real ``prefect server`` on 127.0.0.1 for the session (SQLite, no UI), with start-up
timeouts for a 2-core machine, and helpers to run a worker of type ``mlops-gpu`` against it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import _free_port, stop_scheduler

from mlops_gpu.testing import config_yaml

PREFECT = str(Path(sys.executable).with_name("prefect"))


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("prefect-home")
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home}/prefect.db",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "WARNING"}  # fmt: skip
    log = open(home / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.time() + 180  # a cold start on two busy cores takes a while
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError((home / "server.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def harness(prefect_api: str) -> Iterator[None]:
    """This process's Prefect client pointed at the session's real server."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
        yield


def prefect_env(api: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLOPS_GPU_"))}
    env.update(PREFECT_API_URL=api, PREFECT_HOME=str(home), PREFECT_WORKER_QUERY_SECONDS="1",
               PREFECT_WORKER_PREFETCH_SECONDS="5", PREFECT_WORKER_CANCELLATION_POLL_SECONDS="1",
               PREFECT_LOGGING_LEVEL="INFO")  # fmt: skip
    return env


def mlops_config(d: Path, projects: dict[str, tuple[int, int | None]], **extra: object) -> Path:
    data = yaml.safe_load(config_yaml(projects=projects))
    data["scheduler"] = {"tick_s": 0.2, "idle_exit_s": 60}
    data.update(extra)
    p = d / "mlops-gpu.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


FLOW = """
import os, time
from prefect import flow

@flow(log_prints=True)
def hold(seconds: float = 1.0) -> str:
    print("devices", os.environ.get("CUDA_VISIBLE_DEVICES"),
          "run", os.environ.get("MLOPS_GPU_RUN_ID"))
    time.sleep(seconds)
    return "ok"
"""


class PrefectSetup:
    """A work pool of type ``mlops-gpu``, a deployment per project, and a worker process."""

    def __init__(
        self,
        api: str,
        d: Path,
        cfg: Path,
        projects: list[str],
        gpus: int = 2,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        """``worker_env``: more environment for the worker only (``MLOPS_GPU_URL``, ...)."""
        self.api, self.d, self.cfg = api, d, cfg
        self.env = prefect_env(api, d / "home")
        self.pool = f"pool-{d.name[-12:]}".replace("_", "-")
        (d / "flows").mkdir()
        (d / "flows" / "hold.py").write_text(FLOW)
        self.cli("work-pool", "create", self.pool, "--type", "mlops-gpu")
        for project in projects:
            self.python(
                "from prefect import flow\n"
                f"flow.from_source(source={str(d / 'flows')!r}, entrypoint='hold.py:hold')"
                f".deploy(name={project!r}, work_pool_name={self.pool!r}, job_variables="
                f"{{'project': {project!r}, 'gpus': {gpus}, 'config': {str(cfg)!r}}})\n"
            )
        self.worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", self.pool, "--type", "mlops-gpu"],
            env={**self.env, **(worker_env or {})}, cwd=d,
            stdout=open(d / "worker.log", "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def cli(self, *args: str) -> str:
        r = subprocess.run([PREFECT, *args], env=self.env, capture_output=True, text=True,
                           timeout=180)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def python(self, code: str) -> str:
        r = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True,
                           text=True, timeout=180, cwd=self.d)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def run(self, project: str, seconds: float) -> str:
        """Start a flow run of the project's deployment; its id."""
        out = self.python(
            "from prefect.deployments import run_deployment\n"
            f"print(run_deployment('hold/{project}', timeout=0, "
            f"parameters={{'seconds': {seconds}}}).id)\n"
        )
        return out.strip().splitlines()[-1]

    def close(self, scheduler: bool = True) -> None:
        """The worker stopped, and the scheduler the SDK started (``scheduler``)."""
        self.worker.terminate()
        try:
            self.worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.worker.kill()
        if scheduler:
            stop_scheduler(self.cfg)
