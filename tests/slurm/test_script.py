"""What the Slurm backend hands sbatch, for each shape of run (golden files in ``golden/``;
``MLOPS_GPU_UPDATE_GOLDEN=1`` rewrites them), and that the batch script runs exactly the given
argv whatever it contains. No Slurm needed: the scripts run under bash here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlops_gpu.backends import LaunchError, LauncherSettings, LaunchRequest
from mlops_gpu.backends.slurm_script import (
    SlurmJob,
    batch_script,
    job_name,
    parse_job_name,
    sbatch_argv,
)
from mlops_gpu.model import CheckpointPolicy, NodeSlot, Placement, ResourceRequest
from mlops_gpu.testing import make_spec

GOLDEN = Path(__file__).with_name("golden")
JOB = SlurmJob("/shared/runs/r1/1", "/shared/checkpoints/r1", {"a100-80gb": "a100"},
               python="/opt/venv/bin/python")  # fmt: skip
ENV = {"MLOPS_GPU_RUN_ID": "r0123456789", "MLOPS_GPU_ATTEMPT": "1"}


def placement(gpu_type: str, *slots: tuple[str, tuple[str, ...]]) -> Placement:
    return Placement("hpc", gpu_type, tuple(NodeSlot(n, d) for n, d in slots))


SHAPES = {
    "single-node-2gpu": LaunchRequest(
        "r0123456789", 1, make_spec(gpus=2, command=("python", "train.py", "--lr", "0.1")),
        placement("a100-80gb", ("sn1", ("0", "1"))), launcher=LauncherSettings(),
    ),
    "gang-2x1": LaunchRequest(
        "r0123456789", 2, make_spec(gpus=1, command=("torchrun", "train.py")),
        placement("h100", ("sn3", ("0",)), ("sn4", ("0",))), launcher=LauncherSettings(),
    ),
    "max-runtime-usr1-bare": LaunchRequest(
        "r0123456789", 1,
        replace(make_spec(gpus=1, command=("bash", "-c", "sleep 60")), max_runtime_s=3600,
                checkpoint=CheckpointPolicy(signal="SIGUSR1", grace_s=90), workdir="/home/u/p"),
        placement("a100-80gb", ("sn2", ("3",))),
    ),
    "cpu-only-with-host-resources": LaunchRequest(
        "r0123456789", 1,
        replace(make_spec(gpus=0, command=("python", "prep.py")),
                request=ResourceRequest(gpus=0, cpu_milli=3500, host_memory_mb=8192)),
        placement("a100-80gb", ("sn1", ())), launcher=LauncherSettings(interval_s=5),
    ),
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_golden(shape: str) -> None:
    req = SHAPES[shape]
    job = replace(JOB, partition="gpu", account="ml") if shape == "gang-2x1" else JOB
    text = "$ " + " ".join(sbatch_argv(req, job, f"{job.attempt_dir}/job.sh")) + "\n\n"
    text += batch_script(req, job, ENV, f"{job.attempt_dir}/telemetry.json")
    golden = GOLDEN / f"{shape}.txt"
    if os.environ.get("MLOPS_GPU_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


NASTY = [
    "it's", 'say "hi"', "two\nlines", "$(touch pwned)", "`touch pwned`", "${HOME}", "ünïcødé ✓",
    "a;b|c&d", "*", "-- not an option", "", " lead and trail ",
]  # fmt: skip


def test_the_script_runs_exactly_the_given_argv(tmp_path: Path) -> None:
    show = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['WEIRD']]))"
    req = LaunchRequest("r1", 1, make_spec(gpus=1, command=(sys.executable, "-c", show, *NASTY)),
                        placement("a100-80gb", ("sn1", ("0",))))  # fmt: skip
    env = {"WEIRD": "$(touch pwned) `x` 'q' \"d\"\nline2 ✓"}
    script = tmp_path / "job.sh"
    script.write_text(batch_script(req, JOB, env, None), encoding="utf-8")
    out = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    argv, weird = json.loads(out.stdout)
    assert argv == NASTY and weird == env["WEIRD"]
    assert not (tmp_path / "pwned").exists()


def test_nothing_user_given_reaches_a_directive_or_an_option() -> None:
    spec = replace(make_spec(gpus=1, command=("x",)), name="evil\n#SBATCH --nodes=99")
    req = LaunchRequest("r1", 1, spec, placement("a100-80gb", ("sn1", ("0",))))
    argv = sbatch_argv(req, JOB, "/s/job.sh")
    script = batch_script(req, JOB, {}, None)
    assert "evil" not in " ".join(argv) and "evil" not in script
    assert not any(line.startswith("#SBATCH") for line in script.splitlines())


def test_bad_env_names_and_uneven_gangs_are_refused() -> None:
    req = SHAPES["single-node-2gpu"]
    with pytest.raises(LaunchError, match="not a valid shell name"):
        batch_script(req, JOB, {"BAD;rm -rf /": "x"}, None)
    uneven = replace(req, placement=placement("a100-80gb", ("sn1", ("0", "1")), ("sn2", ("0",))))
    with pytest.raises(LaunchError, match="same GPU count"):
        sbatch_argv(uneven, JOB, "/s/job.sh")


def test_job_names_round_trip() -> None:
    assert parse_job_name(job_name("r0123456789", 12)) == ("r0123456789", 12)
    assert parse_job_name("someone-elses-job") is None
    assert parse_job_name("mlops-gpu.r1.x") is None
