"""``mlops-gpu exec [--run-id ID] [--interval S] -- CMD...``: the job-side launcher.

It starts the child first (before NVML or any network), then, while the child runs, samples the
run's own GPUs (``sampler``) every ``interval_s`` and logs them to the MLflow run over REST
(``tracking.rest``), with MLflow's system-metric names. When the child ends it logs
``mlops_gpu.mean_gpu_utilization`` and, where NVML counts energy, ``mlops_gpu.energy_kwh``, and
exits with the child's status (128 + N if a signal N killed it).

Signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2: the checkpoint signal among them) sent to
the launcher reach the child exactly once:
- When the launcher leads its process group (the local backend's supervisor, a container's
  first process), it passes the signal to the whole group, ignoring its own copy, so that a
  wrapper script's children get it too, as they would without the launcher.
- Otherwise it passes the signal to the child.
- In a terminal's foreground group, SIGINT and SIGQUIT from the keyboard already reach every
  process of the group, so they are not passed on again.
- ``--term-signal SIG``: a SIGTERM is passed on as SIG. Kubernetes stops a pod with SIGTERM
  (then SIGKILL after ``terminationGracePeriodSeconds``); this turns it into the run's
  checkpoint signal.

Idle runs: when every sample for ``idle_after_s`` seconds shows every device under
``idle_below_pct`` utilization, the run is flagged: the tag ``mlops_gpu.idle`` (the time it went
idle) and a line on stderr, once per idle stretch; with ``stop_idle`` the child then gets SIGTERM,
as on a cancel. The seconds of such stretches (the window included) are the run's idle time.

``--telemetry-file``: a JSON file (``mean_utilization``, ``idle_since``, ``idle_s``, ``samples``,
and ``devices``: the last sample of each device, with ``sampled_at``)
rewritten atomically after each sample and at the end, for the backend to read (samples handed
to the controller, which books mean utilization and wasted GPU time in the usage ledger). A
``{node}`` in its name becomes the node's rank in a multi-node job (``SLURM_NODEID``), so each
node of a gang keeps its own.

Invariants:
- Telemetry never fails the run: without NVML, without an MLflow server, with the server down,
  or with an unwritable telemetry file, the child runs and its status comes back; each problem
  is said once on stderr. A missing NVML is recorded once, as the run's ``mlops_gpu.telemetry``
  tag and in the telemetry file's ``note`` (on stderr only without a telemetry file, so that a
  scheduled job's stderr stays the user's own on machines with virtual GPUs).
- Stdlib only, plus ``pynvml`` when sampling: dozens of these start together on one node.
  ``python -m mlops_gpu.telemetry.launcher`` is the entry backends use (no CLI imports).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

# The REST client (urllib, http.client, email: ~20 ms) and the sampler are imported once the
# child runs: on a busy node, every millisecond before the child starts is the job's.
if TYPE_CHECKING:
    from mlops_gpu.telemetry.sampler import GpuSample
    from mlops_gpu.tracking.rest import MlflowRest

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class Launcher:
    def __init__(
        self,
        cmd: list[str],
        *,
        run_id: str | None = None,
        tracking_uri: str | None = None,
        interval_s: float = 10.0,
        nvml: Any | None = None,
        err: TextIO = sys.stderr,
        client: MlflowRest | None = None,
        clock: Callable[[], float] = time.time,
        idle_after_s: float | None = 1800.0,
        stop_idle: bool = False,
        idle_below_pct: float = 1.0,
        telemetry_file: str | None = None,
        term_signal: int | None = None,
    ) -> None:
        self.cmd, self.run_id, self.interval_s = cmd, run_id, interval_s
        #: pass a SIGTERM on as this signal (Kubernetes stops a pod with SIGTERM; the run's
        #: checkpoint signal may be another)
        self.term_signal = term_signal
        self.idle_after_s, self.stop_idle = idle_after_s, stop_idle
        self.idle_below_pct = idle_below_pct
        # ``{node}``: this node's rank in a multi-node job (SLURM_NODEID), one file per node
        node = os.environ.get("SLURM_NODEID", "0")
        self.telemetry_file = telemetry_file.replace("{node}", node) if telemetry_file else None
        self._quiet_from: float | None = None  # start of the current stretch of idle samples
        self._idle_now = False  # the current stretch reached the window
        self._idle_done_s = 0.0  # seconds of idle stretches that ended
        self.idle = False  # flagged at least once
        self.note = ""  # why there is no GPU telemetry, if there is none
        self.tracking_uri, self.nvml, self.err, self.clock = tracking_uri, nvml, err, clock
        self.client = client
        self._said: set[str] = set()
        self.samples: list[list[GpuSample]] = []
        self._sampled_at: float | None = None

    def _say(self, msg: str) -> None:
        if msg not in self._said:
            self._said.add(msg)
            print(f"mlops-gpu exec: {msg}", file=self.err, flush=True)

    def run(self) -> int:
        child = subprocess.Popen(self.cmd)  # first: the job must not wait for telemetry
        leader = os.getpgrp() == os.getpid()

        def forward(n: int, _frame: object) -> None:
            if n in (signal.SIGINT, signal.SIGQUIT) and _foreground():
                return  # the keyboard sent it to the whole group: the child has it
            if n == signal.SIGTERM and self.term_signal is not None:
                n = self.term_signal
            if not leader:
                child.send_signal(n)
                return
            own = signal.signal(n, signal.SIG_IGN)  # our copy is dropped, not queued
            try:
                os.killpg(os.getpgrp(), n)
            except ProcessLookupError:
                pass
            finally:
                signal.signal(n, own)

        previous = {s: signal.signal(s, forward) for s in FORWARDED}
        try:
            return self._watch(child)
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _watch(self, child: subprocess.Popen[bytes]) -> int:
        from mlops_gpu.telemetry.sampler import GpuSampler, visible_devices

        sampler = GpuSampler(visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")), self.nvml)
        rest = self._rest()
        if not sampler.available and sampler.devices:  # (no devices: a CPU-only run, silent)
            self.note = sampler.note
            if not self.telemetry_file:  # a backend's job keeps its stderr for the user's own
                self._say(sampler.note)
            if rest is not None and self.run_id and sampler.note.startswith("no NVML"):
                self._send(
                    lambda: rest.set_tags(self.run_id or "", {"mlops_gpu.telemetry": sampler.note})
                )
        step = 0
        while True:
            try:
                code = child.wait(timeout=self.interval_s)
                break
            except subprocess.TimeoutExpired:
                pass
            if sampler.available:
                samples = sampler.sample()
                self._record(samples, step, rest)
                self._check_idle(samples, child, rest)
                self._write_telemetry()
                step += 1
        end = self.clock()
        if self._idle_now and self._quiet_from is not None:
            self._idle_done_s += end - self._quiet_from
            self._idle_now = False
        self._summary(rest)
        self._write_telemetry(final=True)
        sampler.close()
        return code if code >= 0 else 128 - code

    @property
    def idle_s(self) -> float:
        """Seconds of idle stretches so far, the one in progress included."""
        now_s = 0.0
        if self._idle_now and self._quiet_from is not None:
            now_s = self.clock() - self._quiet_from
        return self._idle_done_s + now_s

    def mean_utilization(self) -> float | None:
        known = [s.utilization_pct for ss in self.samples for s in ss]
        vals = [u for u in known if u is not None]
        return sum(vals) / len(vals) if vals else None

    def _write_telemetry(self, final: bool = False) -> None:
        if not self.telemetry_file:
            return
        data = {
            "mean_utilization": self.mean_utilization(),
            "idle_since": self._quiet_from if self._idle_now else None,
            "idle_s": self.idle_s,
            "samples": len(self.samples),
            "note": self.note,
            "final": final,
            # the last sample of each device, by position (the run's CUDA_VISIBLE_DEVICES
            # order): the scheduler publishes them for metrics (``state.observed``)
            "devices": [
                {
                    "position": s.position,
                    "utilization_pct": s.utilization_pct,
                    "memory_used_mb": s.memory_used_mb,
                }
                for s in (self.samples[-1] if self.samples else ())
            ],
            "sampled_at": self._sampled_at,
        }
        tmp = f"{self.telemetry_file}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.telemetry_file)
        except OSError as e:
            self._say(f"cannot write {self.telemetry_file}: {e}")

    def _check_idle(
        self, samples: list[GpuSample], child: subprocess.Popen[bytes], rest: MlflowRest | None
    ) -> None:
        now = self.clock()
        busy = any(
            s.utilization_pct is None or s.utilization_pct >= self.idle_below_pct for s in samples
        )
        if self._quiet_from is None or busy:
            if self._idle_now and self._quiet_from is not None:
                self._idle_done_s += now - self._quiet_from
            self._idle_now = False
            self._quiet_from = None if busy else now  # the first quiet sample starts a stretch
            return
        if self._idle_now or self.idle_after_s is None:
            return
        if now - self._quiet_from < self.idle_after_s:
            return
        self._idle_now = self.idle = True
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._quiet_from))
        action = "stopping it" if self.stop_idle else "it goes on"
        self._say(
            f"the run's GPUs have been idle (under {self.idle_below_pct:g}% utilization) "
            f"since {since}: {action}"
        )
        if rest is not None and self.run_id:
            self._send(lambda: rest.set_tags(self.run_id or "", {"mlops_gpu.idle": since}))
        if self.stop_idle:
            child.send_signal(signal.SIGTERM)

    def _rest(self) -> MlflowRest | None:
        if self.client is not None:
            return self.client
        if not self.run_id:
            return None
        from mlops_gpu.tracking.rest import MlflowRest, rest_uri

        base = rest_uri(self.tracking_uri)
        if base is None:
            note = (
                f"MLFLOW_TRACKING_URI {self.tracking_uri!r} is not an MLflow server (http/https): "
                "GPU samples are not logged"
            )
            if self.telemetry_file:  # the scheduler logs the summary to its local store
                self.note = self.note or note
            else:
                self._say(note)
            return None
        return MlflowRest(base)

    def _record(self, samples: list[GpuSample], step: int, rest: MlflowRest | None) -> None:
        self.samples.append(samples)
        self._sampled_at = self.clock()
        if rest is None or not self.run_id:
            return
        now = self.clock()
        rows = [(k, v, now, step) for s in samples for k, v in s.metrics().items()]
        self._send(lambda: rest.log_metrics(self.run_id or "", rows))

    def _summary(self, rest: MlflowRest | None) -> None:
        rows: list[tuple[str, float, float, int]] = []
        now = self.clock()
        mean = self.mean_utilization()
        if mean is not None:
            rows.append(("mlops_gpu.mean_gpu_utilization", mean, now, 0))
        if len(self.samples) >= 2:
            first, last = self.samples[0], self.samples[-1]
            pairs = [(a.energy_j, b.energy_j) for a, b in zip(first, last, strict=False)]
            if pairs and all(a is not None and b is not None for a, b in pairs):
                joules = sum(b - a for a, b in pairs if a is not None and b is not None)
                rows.append(("mlops_gpu.energy_kwh", joules / 3.6e6, now, 0))
        if rows and rest is not None and self.run_id:
            self._send(lambda: rest.log_metrics(self.run_id or "", rows))

    def _send(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as e:  # TrackingError; never let telemetry end the run
            self._say(f"MLflow: {e} (the run goes on; later samples are still tried)")


def _foreground() -> bool:
    """True when this process's group is the foreground group of a terminal on stdin."""
    try:
        return os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def main(
    argv: list[str],
    run_id: str | None,
    interval_s: float,
    idle_after_s: float | None = 1800.0,
    stop_idle: bool = False,
    idle_below_pct: float = 1.0,
    telemetry_file: str | None = None,
    term_signal: str | None = None,
) -> int:
    """The CLI's entry: the tracking URI and run id default to MLflow's own variables."""
    launcher = Launcher(
        argv,
        run_id=run_id or os.environ.get("MLFLOW_RUN_ID"),
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"),
        interval_s=interval_s,
        idle_after_s=idle_after_s,
        stop_idle=stop_idle,
        idle_below_pct=idle_below_pct,
        telemetry_file=telemetry_file,
        term_signal=signal_number(term_signal) if term_signal else None,
    )
    return launcher.run()


def signal_number(name: str) -> int:
    """``"USR1"``, ``"SIGUSR1"`` or ``"10"`` -> 10; ValueError for anything else."""
    if name.isdigit():
        return int(name)
    sig = getattr(signal, name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper(),
                  None)  # fmt: skip
    if not isinstance(sig, signal.Signals):
        raise ValueError(f"unknown signal {name!r}")
    return int(sig)


USAGE = (
    "usage: python -m mlops_gpu.telemetry.launcher [--run-id ID] [--interval S] "
    "[--idle-after S] [--idle-below PCT] [--stop-idle] [--telemetry-file F] "
    "[--term-signal SIG] -- CMD..."
)


def _argv_main(args: list[str]) -> int:
    """``python -m mlops_gpu.telemetry.launcher``: the options of ``mlops-gpu exec``, parsed by
    hand (argparse costs milliseconds every job pays before its command starts)."""
    opts: dict[str, str] = {}
    flags = {"--stop-idle"}
    valued = {"--run-id", "--interval", "--idle-after", "--idle-below", "--telemetry-file",
              "--term-signal"}  # fmt: skip
    i = 0
    while i < len(args) and args[i] != "--":
        a = args[i]
        if a in flags:
            opts[a] = "1"
            i += 1
        elif a in valued and i + 1 < len(args):
            opts[a] = args[i + 1]
            i += 2
        else:
            print(f"{USAGE}\nmlops_gpu.telemetry.launcher: bad argument {a!r}", file=sys.stderr)
            return 2
    cmd = args[i + 1 :]
    if not cmd:
        print(f"{USAGE}\nmlops_gpu.telemetry.launcher: a command is required after --",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        interval = max(float(opts.get("--interval", "10")), 0.1)
        idle_after = float(opts["--idle-after"]) if "--idle-after" in opts else None
        idle_below = float(opts.get("--idle-below", "1"))
        term = opts.get("--term-signal")
        if term is not None:
            signal_number(term)
    except ValueError as e:
        print(f"{USAGE}\nmlops_gpu.telemetry.launcher: {e}", file=sys.stderr)
        return 2
    return main(cmd, opts.get("--run-id"), interval, idle_after, "--stop-idle" in opts,
                idle_below, opts.get("--telemetry-file"), term)  # fmt: skip


if __name__ == "__main__":
    sys.exit(_argv_main(sys.argv[1:]))
