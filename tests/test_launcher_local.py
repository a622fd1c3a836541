"""The local backend launching through ``mlops-gpu exec``: the stop signal reaches every process
of the run once; the launcher's telemetry (a fake NVML in the job's own process) reaches the
controller, which flags an idle run, stops it when configured, and books its wasted GPU-hours
in the ledger the report reads."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from test_local_backend import wait_done

from mlops_gpu.backends import JobState, LauncherSettings, LaunchRequest
from mlops_gpu.backends.local import LocalBackend
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.controller.usage_report import build_report
from mlops_gpu.model import CheckpointPolicy, Phase
from mlops_gpu.testing import config_yaml, make_node, make_spec
from mlops_gpu.testing.builders import placed

PY = sys.executable
FAST = LauncherSettings(interval_s=0.1, idle_below_pct=1.0, idle_after_s=0.3)

# A run whose main process and its own child each count the SIGUSR1s they get, then exit.
COUNTER = """
import os, signal, subprocess, sys, time
out, who = sys.argv[1], sys.argv[2]
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
kid = None
if who == "parent":
    kid = subprocess.Popen([sys.executable, "-c", CODE, out, "child"])
open(f"{out}.{who}.ready", "w").close()
deadline = time.time() + 20
while not got and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.5)  # a second copy, if any, would land here
if kid is not None:
    kid.wait()
open(f"{out}.{who}", "w").write(str(len(got)))
"""


@pytest.fixture(autouse=True)
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    # the jobs' own launchers load this instead of the driver
    monkeypatch.setenv("MLOPS_GPU_NVML", "mlops_gpu.testing.fake_nvml:from_env")
    monkeypatch.setenv("MLOPS_GPU_FAKE_UTIL", "40")


def test_the_checkpoint_signal_reaches_each_process_once(tmp_path: Path) -> None:
    b = LocalBackend("local", [make_node("n1", 4)], tmp_path / "state", host="h")
    out = str(tmp_path / "count")
    code = f"CODE = {COUNTER!r}\n" + COUNTER
    spec = make_spec(command=(PY, "-c", code, out, "parent"),
                     checkpoint=CheckpointPolicy(signal="SIGUSR1", grace_s=20))  # fmt: skip
    h = b.launch(LaunchRequest("r1", 1, spec, placed("n1", ["0"]), launcher=FAST))
    for who in ("parent", "child"):
        deadline = time.time() + 20
        while not Path(f"{out}.{who}.ready").exists():
            assert time.time() < deadline, f"{who} never started"
            time.sleep(0.05)
    b.cancel(h, "SIGUSR1", 20)
    st = wait_done(b, h)
    assert st.state is JobState.SUCCEEDED
    assert Path(f"{out}.parent").read_text() == "1" and Path(f"{out}.child").read_text() == "1"


def test_telemetry_comes_back_in_the_status(tmp_path: Path) -> None:
    b = LocalBackend("local", [make_node("n1", 4)], tmp_path / "state", host="h")
    spec = make_spec(command=(PY, "-c", "import time; time.sleep(0.6)"))
    h = b.launch(LaunchRequest("r1", 1, spec, placed("n1", ["1", "2"]), launcher=FAST))
    st = wait_done(b, h)
    tel = st.telemetry
    assert st.state is JobState.SUCCEEDED and tel is not None
    assert tel.mean_utilization == 40.0 and tel.idle_s == 0.0


def idle_runtime(tmp_path: Path, stop: bool) -> Runtime:
    telemetry = {"interval_s": 0.1, "idle_below_pct": 5, "idle_after_s": 0.5, "stop_idle": stop}
    p = tmp_path / "mlops-gpu.yaml"
    p.write_text(config_yaml(extra={"telemetry": telemetry}))
    return Runtime.load(p)


def run_to_end(rt: Runtime, ctl: Controller, run_id: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        ctl.tick()
        run = rt.store.get(run_id)
        assert run is not None
        if run.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED):
            return
        time.sleep(0.05)
    raise AssertionError("the run did not finish")


@pytest.mark.parametrize("stop", [False, True], ids=["flagged", "stopped"])
def test_an_idle_run_is_flagged_and_its_waste_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: bool
) -> None:
    monkeypatch.setenv("MLOPS_GPU_FAKE_UTIL", "0")
    rt = idle_runtime(tmp_path, stop)
    run = rt.submit(make_spec(gpus=2, command=(PY, "-c", "import time; time.sleep(3)")))
    ctl = Controller(rt)
    run_to_end(rt, ctl, run.id)
    done = rt.store.get(run.id)
    assert done is not None
    kinds = [e.kind for e in rt.store.events(run.id)]
    if stop:
        assert done.phase is Phase.FAILED and "idle" in (done.reason or "")
    else:
        assert done.phase is Phase.SUCCEEDED and "idle" in kinds
    (row,) = rt.store.usage()
    assert row.mean_util == 0.0 and 0.4 < row.idle_s <= row.end - row.start
    prices = {t: g.price_per_hour for t, g in rt.cfg.model_gpu_types().items()}
    report = build_report(rt.store.usage(), prices, None)
    assert report["total"]["wasted_gpu_hours"] == pytest.approx(2 * row.idle_s / 3600, abs=1e-6)
    if stop:  # stopped soon after the window, long before its 3 s
        assert row.end - row.start < 2.5
