"""Issue 24 item 1 end to end: the real CLI on the local backend (virtual GPUs), with the config
``mlops-gpu init`` writes in a fresh HOME (one project whose quota is the node, ``order:
shortest``). A whole-node run with a longer max_runtime, submitted behind small short runs of
the same project while more keep coming, starts within a bounded time; on the main this issue
starts from it waited behind every one of them (blocked by its own project's quota, it got no
reservation; and the order prefers the shorter runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import run_cli

from mlops_gpu.sdk.run import submit


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=home, env={"HOME": str(home)})


def _small(config: Path, n: int) -> None:
    """One of the stream: 1 GPU for 6-10 s, max_runtime 20 s (the SDK: a faster stream than
    one CLI process per run on a loaded machine; the node runs about one every 2 s)."""
    submit(
        [sys.executable, "-c", f"import time; time.sleep({6 + n % 5})"],
        project="default",
        name=f"small-{n}",
        max_runtime=20.0,
        config=config,
        start_scheduler=False,
    )


def test_whole_node_run_behind_a_stream_of_small_runs_starts(tmp_path: Path) -> None:
    home = tmp_path
    r = _cli(home, "init", "--virtual-gpus", "4")
    assert r.returncode == 0, r.stderr
    config = home / "mlops-gpu.yaml"
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "mlops_gpu.cli.main", "scheduler"],
        cwd=home,
        env={**os.environ, "HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for n in range(6):  # they hold the node and the project's whole quota, and queue
            _small(config, n)
        time.sleep(1.0)
        r = _cli(
            home,
            *("submit", "--project", "default", "--gpus", "4", "--max-runtime", "5m"),
            *("--name", "big", "--no-start", "--", sys.executable, "-c", "print('big')"),
        )
        assert r.returncode == 0, r.stderr
        big = r.stdout.strip()
        submitted, started, n = time.time(), None, 6
        while time.time() - submitted < 45:
            for _ in range(3):  # faster than the node runs them: the queue never empties
                _small(config, n)
                n += 1
            (st,) = json.loads(_cli(home, "status", big, "--json").stdout)
            if st["phase"] in ("admitted", "starting", "running", "succeeded"):
                started = time.time() - submitted
                break
        assert started is not None, f"big never started; {n - 6} small runs came after it"
        print(f"big started after {started:.1f} s; {n - 6} small runs came after it")
        assert started < 30, started
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)
