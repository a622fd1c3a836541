"""The ``slurm`` backend: runs as Slurm batch jobs pinned to the core's placement, through the
cluster's command-line tools.

- Inventory: ``sinfo --json`` (cached ``inventory_s``): one node per Slurm node with GPU GRES,
  its GRES type mapped back to our GPU type; drained or down nodes are listed unschedulable.
- Power saving (``slurm_power``): ``power_states()`` gives the pool state of each node under
  Slurm's power saving, from the same ``sinfo``; powered-down nodes are listed unschedulable
  (the controller's ``pools`` opens them to the core when a boot is worth it: a job pinned to one
  makes Slurm resume it), booting ones schedulable (Slurm starts their jobs once they are up).
- Launch: the job's files go to ``<shared_dir>/runs/<run>/<attempt>/`` (``job.sh``,
  ``stdout.log``, ``stderr.log``, ``telemetry.<node>.json``); ``sbatch --parsable`` with every
  option as argv (``slurm_script``): ``--nodelist``, ``--nodes``, ``--gres=gpu:TYPE:N``,
  ``--no-requeue``, job name ``mlops-gpu.<run>.<attempt>``. Slurm picks the device indices
  inside each node (``CUDA_VISIBLE_DEVICES`` is Slurm's); the core's device ids are its own
  bookkeeping.
- Status: one ``squeue --json`` per poll for all handles, filtered here; a job that left squeue
  is looked up with ``scontrol show job``, then in the completion records (``sacct -c``), so a
  job that ended while the scheduler was down is recorded as it ended. Only a job no source
  knows is ``lost``. A job still pending because a node it is pinned to is down, failed or
  drained (``ReqNodeNotAvail``) is cancelled and then reported ``lost`` (``slurm_stuck``), so
  the run is requeued elsewhere instead of waiting for an admin. After a ``lost`` job the next
  ``inventory()`` reads ``sinfo`` afresh, whatever ``inventory_s`` says, so the core does not
  place the requeued run on the dead node again.
- Stop: ``scancel --signal=SIG --batch`` (the batch step runs the launcher, which passes the
  signal on), then ``scancel`` once the grace has passed. Deadlines are kept in
  ``<shared_dir>/kills.json`` and checked at every poll and cancel, so a restart keeps them.
- Handles: ``slurm:<cluster>:<jobid>``; before signalling, the job must be one of ours (its name
  is ``mlops-gpu.<run>.<attempt>``) and, if Slurm still knows it, still carry that name.

Transport: the command-line tools only (``SLURM_CONF`` from the config). ``slurmrestd`` is not
supported yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlops_gpu.backends.base import (
    HandleError,
    JobState,
    JobStatus,
    JobTelemetry,
    LaunchError,
    LaunchRequest,
    job_env,
)
from mlops_gpu.backends.slurm_parse import (
    REASONS,
    SACCT_FIELDS,
    SlurmJobInfo,
    expand_hostlist,
    parse_sacct,
    parse_scontrol_job,
    parse_sinfo,
    parse_squeue,
)
from mlops_gpu.backends.slurm_power import power_managed, power_state
from mlops_gpu.backends.slurm_script import (
    SlurmJob,
    batch_script,
    job_name,
    parse_job_name,
    sbatch_argv,
)
from mlops_gpu.backends.slurm_stuck import StuckJobs
from mlops_gpu.model import BackendCapabilities, Node, NodeState


class SlurmError(RuntimeError):
    """A Slurm command failed or timed out."""


class SlurmBackend:
    kind = "slurm"
    # Gangs as one multi-node job; no MIG or shared GPUs through GRES (yet).
    capabilities = BackendCapabilities(
        multi_node=True,
        mig=False,
        shared_gpus=False,
        checkpoint_signal=True,
        parallel_launch=True,  # each launch is an sbatch round trip
    )

    def __init__(
        self,
        name: str,
        shared_dir: Path,
        *,
        cluster: str = "slurm",
        partition: str | None = None,
        account: str | None = None,
        gres_types: Mapping[str, str] | None = None,
        slurm_conf: str | None = None,
        python: str | None = None,
        inventory_s: float = 10.0,
        timeout_s: float = 30.0,
        labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.name, self.cluster = name, cluster
        self.shared_dir = Path(shared_dir)
        self.gres_types = dict(gres_types or {})
        self._gpu_type_of = {g: t for t, g in self.gres_types.items()}
        self.partition, self.account = partition, account
        self.python = python or sys.executable
        self.inventory_s, self.timeout_s = inventory_s, timeout_s
        self.labels = {k: dict(v) for k, v in (labels or {}).items()}
        self.env = dict(os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf
        self._inventory: list[Node] = []
        self._inventory_at = float("-inf")
        #: a job was lost since the last ``sinfo`` (a node may have died): read it afresh
        self._stale = False
        #: nodes seen under power saving (a cloud node up shows no power flag), and their states
        self._managed: set[str] = set()
        self._power: dict[str, NodeState] = {}
        self._kills_file = self.shared_dir / "kills.json"
        self._stuck = StuckJobs(self.shared_dir / "stuck.json")

    # -- commands -------------------------------------------------------------------------
    def _run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                list(argv), env=self.env, capture_output=True, text=True, timeout=self.timeout_s
            )
        except FileNotFoundError:
            raise SlurmError(
                f"{argv[0]}: not found (are Slurm's client tools installed?)"
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{' '.join(argv[:2])}: no answer in {self.timeout_s:g}s") from None
        if check and proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise SlurmError(
                f"{' '.join(argv[:2])} failed ({proc.returncode}): {' '.join(msg)[:500]}"
            )
        return proc

    def _json(self, argv: Sequence[str]) -> dict[str, object]:
        out = self._run(argv).stdout
        try:
            doc = json.loads(out)
        except ValueError:
            raise SlurmError(f"{argv[0]} --json printed no JSON: {out[:200]!r}") from None
        return doc if isinstance(doc, dict) else {}

    # -- interface ------------------------------------------------------------------------
    def inventory(self) -> list[Node]:
        now = time.monotonic()
        if not self._stale and now - self._inventory_at < self.inventory_s:
            return list(self._inventory)
        nodes = []
        try:
            listed = parse_sinfo(self._json(["sinfo", "--json"]))
        except SlurmError:
            if self._inventory_at == float("-inf"):
                raise
            return list(self._inventory)  # slurmctld is away: the last nodes seen stand
        power: dict[str, NodeState] = {}
        for n in listed:
            if power_managed(n.words):
                self._managed.add(n.name)
            if n.name in self._managed and (st := power_state(n.words)) is not None:
                power[n.name] = st
            for gres_type, count in sorted(n.gres.items()):
                gpu_type = self._gpu_type_of.get(gres_type, gres_type)
                nodes.append(
                    Node(
                        name=n.name,
                        backend=self.name,
                        gpu_type=gpu_type,
                        devices=tuple(str(i) for i in range(count)),
                        labels=self.labels.get(n.name, {}),
                        schedulable=n.schedulable,
                        state_reason=n.reason,
                    )
                )
                break  # one GPU type per node: the core's model of a node
        self._inventory, self._inventory_at, self._power = nodes, now, power
        self._stale = False
        return list(nodes)

    def power_states(self) -> dict[str, NodeState]:
        """Pool state of each node under Slurm's power saving (``slurm_power``) as of the last
        ``inventory()``; nodes down or failed (a resume that timed out) are left out."""
        return dict(self._power)

    def attempt_dir(self, run_id: str, attempt: int) -> Path:
        return self.shared_dir / "runs" / run_id / str(attempt)

    def launch(self, req: LaunchRequest) -> str:
        d = self.attempt_dir(req.run_id, req.attempt)
        ckpt = self.shared_dir / "checkpoints" / req.run_id
        try:
            d.mkdir(parents=True, exist_ok=True)
            ckpt.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LaunchError(f"cannot create {d}: {e}") from e
        job = SlurmJob(
            str(d), str(ckpt), self.gres_types, self.partition, self.account, self.python
        )
        env = job_env(req, str(ckpt))
        tfile = str(d / "telemetry.{node}.json") if req.launcher is not None else None
        script = d / "job.sh"
        script.write_text(batch_script(req, job, env, tfile), encoding="utf-8")
        try:
            out = self._run(sbatch_argv(req, job, str(script))).stdout.strip()
        except SlurmError as e:
            raise LaunchError(str(e)) from e
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise LaunchError(f"sbatch printed {out!r}, not a job id")
        (d / "job_id").write_text(job_id)
        return self._handle(job_id)

    def poll(self, handles: Sequence[str]) -> dict[str, JobStatus]:
        self._kill_due()
        if not handles:
            return {}
        ids = {self._parse(h): h for h in handles}
        queue = parse_squeue(self._json(["squeue", "--all", "--json"]), ids)
        gone = [j for j in ids if j not in queue]
        if gone:
            queue.update(self._finished(gone))
        out = {h: self._status(h, queue.get(j)) for j, h in ids.items()}
        for j, why in self._stuck.why(queue).items():  # cancelled as stuck at an earlier poll
            out[ids[j]] = JobStatus(ids[j], JobState.LOST, reason=f"Slurm job {j} {why}")
        self._stuck.sweep(
            queue,
            lambda: parse_sinfo(self._json(["sinfo", "--json"])),
            self._hostnames,
            lambda jobs: self._run(["scancel", "--state=PENDING", *jobs]),
        )
        if any(st.state is JobState.LOST for st in out.values()):
            self._stale = True
        return out

    def _hostnames(self, hostlist: str) -> list[str]:
        names = expand_hostlist(hostlist)
        if names is None:  # a form read by scontrol only
            proc = self._run(["scontrol", "show", "hostnames", hostlist], check=False)
            names = proc.stdout.split() if proc.returncode == 0 else []
        return names

    def cancel(self, handle: str, signal: str, grace_s: float) -> None:
        job_id = self._parse(handle)
        info = self._lookup(job_id)
        if info is None or parse_job_name(info.name) is None:
            raise HandleError(f"{handle}: Slurm has no job {job_id} of mlops-gpu's")
        if info.ours not in (JobState.STARTING, JobState.RUNNING):
            return
        sig = signal[3:] if signal.upper().startswith("SIG") else signal
        if info.ours is JobState.STARTING or grace_s <= 0:
            self._scancel([job_id])  # not started yet, or no grace: nothing to checkpoint
            return
        self._run(["scancel", f"--signal={sig}", "--batch", job_id], check=False)
        kills = self._kills()
        kills[job_id] = time.time() + grace_s
        self._save_kills(kills)

    def find(self, run_id: str, attempt: int) -> str | None:
        name = job_name(run_id, attempt)
        for j in parse_squeue(self._json(["squeue", "--all", "--json"])).values():
            if j.name == name:
                return self._handle(j.job_id)
        f = self.attempt_dir(run_id, attempt) / "job_id"
        if f.exists() and f.read_text().strip().isdigit():
            job_id = f.read_text().strip()
            info = self._lookup(job_id)
            if info is not None and info.name == name:
                return self._handle(job_id)
        return None

    def log_files(self, run_id: str, attempt: int) -> list[Path]:
        d = self.attempt_dir(run_id, attempt)
        return [p for p in (d / "stdout.log", d / "stderr.log") if p.exists()]

    # -- helpers --------------------------------------------------------------------------
    def _handle(self, job_id: str) -> str:
        return f"slurm:{self.cluster}:{job_id}"

    def _parse(self, handle: str) -> str:
        parts = handle.split(":")
        if len(parts) != 3 or parts[0] != "slurm" or not parts[2].isdigit():
            raise HandleError(f"{handle!r} is not a Slurm backend handle")
        if parts[1] != self.cluster:
            raise HandleError(f"{handle!r} belongs to cluster {parts[1]}, not {self.cluster}")
        return parts[2]

    def _lookup(self, job_id: str) -> SlurmJobInfo | None:
        queue = parse_squeue(self._json(["squeue", "--all", "--json"]), [job_id])
        if job_id in queue:
            return queue[job_id]
        return self._finished([job_id]).get(job_id)

    def _finished(self, job_ids: list[str]) -> dict[str, SlurmJobInfo]:
        """Jobs squeue no longer lists: ``scontrol`` while Slurm remembers them, then the
        completion records."""
        out: dict[str, SlurmJobInfo] = {}
        for jid in job_ids:
            proc = self._run(["scontrol", "show", "job", jid], check=False)
            info = parse_scontrol_job(proc.stdout) if proc.returncode == 0 else None
            if info is not None:
                out[jid] = info
        rest = [j for j in job_ids if j not in out]
        if rest:
            proc = self._run(
                ["sacct", "-c", "--parsable2", "--noheader", f"--format={SACCT_FIELDS}",
                 f"--jobs={','.join(rest)}"],
                check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                found = parse_sacct(proc.stdout)
                out.update({j: found[j] for j in rest if j in found})
        return out

    def _status(self, handle: str, info: SlurmJobInfo | None) -> JobStatus:
        if info is None:
            return JobStatus(handle, JobState.LOST, reason="Slurm has no record of the job")
        state = info.ours
        tel = self._telemetry(info)
        if state in (JobState.STARTING, JobState.RUNNING):
            return JobStatus(handle, state, started_at=info.start, telemetry=tel)
        code = info.exit_code
        if info.signal:
            code = -info.signal
        if state is JobState.FAILED and info.state == "COMPLETED":
            state = JobState.SUCCEEDED
        if state is JobState.SUCCEEDED and code not in (0, None):
            state = JobState.FAILED
        reason = REASONS.get(info.state, "exited")
        if state is JobState.LOST:
            reason = f"Slurm job {info.job_id} ended {info.state}: {reason}"
        return JobStatus(handle, state, code, info.start, info.end, reason, tel)

    def _telemetry(self, info: SlurmJobInfo) -> JobTelemetry | None:
        """The launchers' summaries, one per node, as one: utilization averaged over the nodes
        that sampled; idle only while every node was (the least idle time, the latest start)."""
        parsed = parse_job_name(info.name)
        if parsed is None:
            return None
        parts = []
        for f in sorted(self.attempt_dir(*parsed).glob("telemetry.*.json")):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                parts.append(JobTelemetry.from_dict(json.loads(f.read_text())))
        if not parts:
            return None
        utils = [p.mean_utilization for p in parts if p.mean_utilization is not None]
        since = [p.idle_since for p in parts]
        return JobTelemetry(
            sum(utils) / len(utils) if utils else None,
            None if None in since else max(s for s in since if s is not None),
            min(p.idle_s for p in parts),
            # per-device samples of a one-node job (a gang's positions repeat on each node)
            parts[0].devices if len(parts) == 1 else (),
            parts[0].sampled_at if len(parts) == 1 else None,
        )

    def _scancel(self, job_ids: list[str]) -> None:
        if job_ids:
            self._run(["scancel", *job_ids], check=False)

    def _kills(self) -> dict[str, float]:
        try:
            data = json.loads(self._kills_file.read_text())
            return {str(k): float(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _save_kills(self, kills: dict[str, float]) -> None:
        self.shared_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._kills_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(kills))
        os.replace(tmp, self._kills_file)

    def _kill_due(self) -> None:
        kills = self._kills()
        if not kills:
            return
        now = time.time()
        due = [j for j, t in kills.items() if t <= now]
        if due:
            with contextlib.suppress(SlurmError):
                self._scancel(due)
            self._save_kills({j: t for j, t in kills.items() if j not in due})
