"""Every deployment of ``flows/prefect.yaml``, from the README's steps, against a real Prefect
server: ``mlops-gpu init`` (the starter config, in a clean HOME), the work pool the README
names, ``prefect deploy --all``, an ``mlops-gpu`` worker, then one run of each deployment, all
of which must end Completed (the CPU-only ones included). The README's ``deploy()`` example of
``@gpu_flow`` deploys without an image."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import PREFECT, prefect_env
from .test_worker import api_call, flow_run, until

ROOT = Path(__file__).resolve().parents[2]
FLOWS = ROOT / "flows"
MLOPS_GPU = str(Path(sys.executable).with_name("mlops-gpu"))


def readme_pools() -> set[str]:
    """The work pools the READMEs tell users to create and start workers for."""
    text = (ROOT / "README.md").read_text() + (FLOWS / "README.md").read_text()
    created = re.findall(r"prefect work-pool create (\S+)", text)
    started = re.findall(r"prefect worker start --pool (\S+)", text)
    return set(created) | set(started)


def readme_example() -> str:
    """The README's ``@gpu_flow`` / ``@gpu_task`` example file, as printed."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index("in a file `embed_flow.py`:") :]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readmes_and_prefect_yaml_name_one_work_pool() -> None:
    shipped = yaml.safe_load((FLOWS / "prefect.yaml").read_text())
    pools = {d["work_pool"]["name"] for d in shipped["deployments"]}
    assert pools == {"mlops-gpu"} and readme_pools() == pools


@pytest.mark.slow
@pytest.mark.prefect_server
def test_every_deployment_of_prefect_yaml_runs_to_completed(
    prefect_api: str, tmp_path: Path
) -> None:
    home, work, flows = tmp_path / "home", tmp_path / "work", tmp_path / "flows"
    home.mkdir()
    work.mkdir()
    shutil.copytree(FLOWS, flows)
    env = prefect_env(prefect_api, tmp_path / "prefect-home")
    env.update(HOME=str(home), MLOPS_GPU_FLOWS_DIR=str(flows))

    def sh(*argv: str, cwd: Path) -> str:
        r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    sh(MLOPS_GPU, "init", "--virtual-gpus", "4", cwd=work)  # the starter config, in ./
    cfg = work / "mlops-gpu.yaml"
    sh(PREFECT, "work-pool", "create", "mlops-gpu", "--type", "mlops-gpu", cwd=work)
    sh(PREFECT, "deploy", "--all", cwd=flows)
    mine = tmp_path / "mine"  # the README's decorator example, deployed as it says
    mine.mkdir()
    (mine / "embed_flow.py").write_text(readme_example())
    sh(sys.executable, "embed_flow.py", cwd=mine)
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "mlops-gpu", "--type",
                               "mlops-gpu"], env=env, cwd=work, stdout=log,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        shipped = yaml.safe_load((flows / "prefect.yaml").read_text())["deployments"]
        names = [d["name"] for d in shipped] + ["embeddings"]
        deps = {d["name"]: d for d in api_call(prefect_api, "POST", "/deployments/filter", {})}
        assert set(deps) == set(names)
        assert deps["embeddings"]["work_pool_name"] == "mlops-gpu"
        runs = {n: api_call(prefect_api, "POST", f"/deployments/{deps[n]['id']}/create_flow_run",
                            {})["id"] for n in names}  # fmt: skip
        done = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

        def states() -> dict[str, str]:
            return {n: flow_run(prefect_api, f)["state"]["type"] for n, f in runs.items()}

        until(lambda: all(s in done for s in states().values()), 420, "the flow runs")
        log.flush()
        for n, f in runs.items():  # how long each took, for whoever sizes this test
            fr = flow_run(prefect_api, f)
            print(f"{n}: {fr['state']['type']} {fr['start_time']} -> {fr['end_time']}")
        assert set(states().values()) == {"COMPLETED"}, (
            f"{states()}\n{(tmp_path / 'worker.log').read_text()[-4000:]}"
        )
        report = list((flows / "reports").glob("usage-*-by-project.json"))
        assert report  # the usage report wrote its files where its deployment runs
        from mlops_gpu.controller import Runtime

        held = [r.spec.name for r in Runtime.load(cfg).store.list_runs()]
        assert "task:embed" not in held  # the example's tasks ran on its flow's own 2 GPUs
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
        from conftest import stop_scheduler

        stop_scheduler(cfg)
