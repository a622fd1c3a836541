"""What the Slurm backend hands ``sbatch``: the command line (every option, as argv) and the batch
script (the job's environment and the launcher's ``exec`` line).

Invariants:
- Nothing user-given reaches a ``#SBATCH`` line or sbatch's option parser as text to split:
  options are argv elements, and the script's only user-given parts (environment values and
  the command's arguments) are single-quoted by ``shlex.quote``. Quotes, newlines, ``$()``,
  backticks and unicode in names, commands and values run as the exact given argv.
- Environment variable *names* must be valid shell names; another name is refused, not quoted.
- The job name and comment carry the run id and attempt (``mlops-gpu.<run>.<attempt>``), so a
  restarted scheduler matches jobs back to runs; the run's own name is never used.
- Requeueing is the scheduler's, not Slurm's: always ``--no-requeue``.
- ``max_runtime``: ``--time`` is max_runtime plus the grace (whole minutes, rounded up) and
  ``--signal=B:<checkpoint signal>@<grace>`` makes Slurm send the checkpoint signal to the batch
  step (the launcher) that long before the limit, so a job past its time gets the same grace
  as a preempted one (Slurm sends it within about a minute of that moment).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mlops_gpu.backends.base import LaunchError, LauncherSettings, LaunchRequest

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
JOB_PREFIX = "mlops-gpu."


def job_name(run_id: str, attempt: int) -> str:
    return f"{JOB_PREFIX}{run_id}.{attempt}"


def parse_job_name(name: str) -> tuple[str, int] | None:
    """(run id, attempt) from a job name this backend gave, else None."""
    if not name.startswith(JOB_PREFIX):
        return None
    run_id, _, attempt = name[len(JOB_PREFIX) :].rpartition(".")
    return (run_id, int(attempt)) if run_id and attempt.isdigit() else None


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """Where a job's files go (on storage the compute nodes share) and how Slurm names things."""

    attempt_dir: str
    checkpoint_dir: str
    #: our GPU type name -> the GRES type Slurm knows it by
    gres_types: Mapping[str, str]
    partition: str | None = None
    account: str | None = None
    #: the Python that runs the launcher on the compute nodes
    python: str = "python3"


def sbatch_argv(req: LaunchRequest, job: SlurmJob, script_path: str) -> list[str]:
    """``sbatch`` and its options, pinning the job to the core's placement."""
    p, spec = req.placement, req.spec
    per_node = {len(s.devices) for s in p.slots}
    if len(per_node) != 1:
        raise LaunchError(
            "a Slurm job gives every node the same GPU count; this placement does not"
        )
    (gpus,) = per_node
    gres = job.gres_types.get(p.gpu_type, p.gpu_type)
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name(req.run_id, req.attempt)}",
        f"--comment=mlops_gpu run {req.run_id} attempt {req.attempt}",
        f"--nodes={len(p.slots)}",
        f"--nodelist={','.join(p.node_names)}",
        "--ntasks-per-node=1",
        "--no-requeue",
        f"--output={job.attempt_dir}/stdout.log",
        f"--error={job.attempt_dir}/stderr.log",
        f"--chdir={spec.workdir or job.attempt_dir}",
    ]
    if gpus:
        argv.append(f"--gres=gpu:{gres}:{gpus}")
    if job.partition:
        argv.append(f"--partition={job.partition}")
    if job.account:
        argv.append(f"--account={job.account}")
    r = spec.request
    if r.cpu_milli:
        argv.append(f"--cpus-per-task={math.ceil(r.cpu_milli / 1000)}")
    if r.host_memory_mb:
        argv.append(f"--mem={r.host_memory_mb}M")
    if spec.max_runtime_s is not None:
        grace = max(math.ceil(spec.checkpoint.grace_s), 0)
        minutes = max(1, math.ceil((spec.max_runtime_s + grace) / 60))
        # B: the batch step's process (the launcher, which passes it on), as a stop does
        argv += [f"--time={minutes}", f"--signal=B:{_signal_name(spec.checkpoint.signal)}@{grace}"]
    return [*argv, script_path]


def batch_script(
    req: LaunchRequest, job: SlurmJob, env: Mapping[str, str], telemetry_file: str | None
) -> str:
    """The batch script: exports, then ``exec`` of the launcher (or the bare command); a gang
    runs one copy per node through ``srun``."""
    lines = [
        "#!/bin/bash",
        f"# mlops-gpu run {req.run_id} attempt {req.attempt}: generated, do not edit",
    ]
    for name in sorted(env):
        if not _ENV_NAME.match(name):
            raise LaunchError(f"environment variable name {name!r} is not a valid shell name")
        lines.append(f"export {name}={shlex.quote(env[name])}")
    cmd: Sequence[str] = req.spec.command
    launcher: LauncherSettings | None = req.launcher
    if launcher is not None:
        cmd = launcher.argv(job.python, cmd, telemetry_file)
    if len(req.placement.slots) > 1:
        cmd = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *cmd]
    lines.append("exec " + " ".join(shlex.quote(a) for a in cmd))
    return "\n".join(lines) + "\n"


def _signal_name(sig: str) -> str:
    return sig[3:] if sig.upper().startswith("SIG") else sig
