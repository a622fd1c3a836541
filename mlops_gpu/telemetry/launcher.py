"""``mlops-gpu exec [--run-id ID] [--interval S] -- CMD...``: the job-side launcher.

It starts the child first (before NVML or any network), then, while the child runs, samples the
run's own GPUs (``sampler``) every ``interval_s`` and logs them to the MLflow run over REST
(``mlflow_rest``), with MLflow's system-metric names. Signals it receives (SIGTERM, SIGINT,
SIGHUP, SIGUSR1, SIGUSR2: the checkpoint signal on preemption among them) go to the child. When
the child ends it logs ``mlops_gpu.mean_gpu_utilization`` and, where NVML counts energy,
``mlops_gpu.energy_kwh``, and exits with the child's status (128 + N if a signal N killed it).

Idle runs: when every sample of the last ``idle_after_s`` seconds shows 0% utilization on every
device, the run is tagged ``mlops_gpu.idle`` (with the time it went idle) and says so on
stderr, once; with ``stop_idle`` the child then gets SIGTERM, as on a cancel.

Invariants:
- Telemetry never fails the run: without NVML, without an MLflow server, or with the server
  down, the child runs and its status comes back; each problem is said once on stderr (and, for
  a missing NVML, as the run's ``mlops_gpu.telemetry`` tag).
- Stdlib only, plus ``pynvml`` when sampling: dozens of these start together on one node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from mlops_gpu.telemetry.mlflow_rest import MlflowRest, TrackingError, rest_uri
from mlops_gpu.telemetry.sampler import GpuSample, GpuSampler, visible_devices

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
    ) -> None:
        self.cmd, self.run_id, self.interval_s = cmd, run_id, interval_s
        self.idle_after_s, self.stop_idle = idle_after_s, stop_idle
        self._busy_at: float | None = None  # the last sample with any utilization
        self.idle = False
        self.tracking_uri, self.nvml, self.err, self.clock = tracking_uri, nvml, err, clock
        self.client = client
        self._said: set[str] = set()
        self.samples: list[list[GpuSample]] = []

    def _say(self, msg: str) -> None:
        if msg not in self._said:
            self._said.add(msg)
            print(f"mlops-gpu exec: {msg}", file=self.err, flush=True)

    def run(self) -> int:
        child = subprocess.Popen(self.cmd)  # first: the job must not wait for telemetry
        previous = {s: signal.signal(s, lambda n, _f: child.send_signal(n)) for s in FORWARDED}
        try:
            return self._watch(child)
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _watch(self, child: subprocess.Popen[bytes]) -> int:
        sampler = GpuSampler(visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")), self.nvml)
        rest = self._rest()
        if not sampler.available and sampler.devices:  # (no devices: a CPU-only run, silent)
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
                step += 1
        self._summary(rest)
        sampler.close()
        return code if code >= 0 else 128 - code

    def _check_idle(
        self, samples: list[GpuSample], child: subprocess.Popen[bytes], rest: MlflowRest | None
    ) -> None:
        now = self.clock()
        if self._busy_at is None or any(s.utilization_pct for s in samples):
            self._busy_at = now  # the first sample starts the clock; any use restarts it
            return
        if self.idle or self.idle_after_s is None or now - self._busy_at < self.idle_after_s:
            return
        self.idle = True
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._busy_at))
        action = "stopping it" if self.stop_idle else "it goes on"
        self._say(f"the run's GPUs have been idle (0% utilization) since {since}: {action}")
        if rest is not None and self.run_id:
            self._send(lambda: rest.set_tags(self.run_id or "", {"mlops_gpu.idle": since}))
        if self.stop_idle:
            child.send_signal(signal.SIGTERM)

    def _rest(self) -> MlflowRest | None:
        if self.client is not None:
            return self.client
        if not self.run_id:
            return None
        base = rest_uri(self.tracking_uri)
        if base is None:
            self._say(
                f"MLFLOW_TRACKING_URI {self.tracking_uri!r} is not an MLflow server (http/https): "
                "GPU metrics are not logged"
            )
            return None
        return MlflowRest(base)

    def _record(self, samples: list[GpuSample], step: int, rest: MlflowRest | None) -> None:
        self.samples.append(samples)
        if rest is None or not self.run_id:
            return
        now = self.clock()
        rows = [(k, v, now, step) for s in samples for k, v in s.metrics().items()]
        self._send(lambda: rest.log_metrics(self.run_id or "", rows))

    def _summary(self, rest: MlflowRest | None) -> None:
        utils = [s.utilization_pct for ss in self.samples for s in ss]
        known = [u for u in utils if u is not None]
        rows: list[tuple[str, float, float, int]] = []
        now = self.clock()
        if known:
            rows.append(("mlops_gpu.mean_gpu_utilization", sum(known) / len(known), now, 0))
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
        except TrackingError as e:
            self._say(f"MLflow: {e} (the run goes on; later samples are still tried)")


def main(
    argv: list[str],
    run_id: str | None,
    interval_s: float,
    idle_after_s: float | None = 1800.0,
    stop_idle: bool = False,
) -> int:
    """The CLI's entry: the tracking URI and run id default to MLflow's own variables."""
    launcher = Launcher(
        argv,
        run_id=run_id or os.environ.get("MLFLOW_RUN_ID"),
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"),
        interval_s=interval_s,
        idle_after_s=idle_after_s,
        stop_idle=stop_idle,
    )
    return launcher.run()
