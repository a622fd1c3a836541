"""The ``mlops-gpu scheduler`` daemon as the end-to-end benchmarks run it (slurm_overhead,
k8s_throughput): its own process with production defaults, up before the first submit (as in
production), its log in a file, its CPU time readable. Not a benchmark itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


class SchedulerDaemon:
    """``with SchedulerDaemon(cfg, log) as daemon: ... daemon.cpu_s()``."""

    def __init__(self, cfg: Path, log: Path, timeout: float = 120) -> None:
        self.cfg, self.log, self.timeout = cfg, log, timeout

    def __enter__(self) -> SchedulerDaemon:
        with open(self.log, "w") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(self.cfg),
                 "scheduler"], stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.time() + self.timeout
        while "scheduler started" not in self.log.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                raise RuntimeError(self.log.read_text()[-2000:])
            time.sleep(0.1)
        self.cpu0 = cpu_s(self.proc.pid)
        return self

    def cpu_s(self) -> float:
        """CPU seconds the daemon spent since it was up."""
        return cpu_s(self.proc.pid) - self.cpu0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
