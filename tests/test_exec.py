"""``mlops-gpu exec``: the run's own GPUs sampled through a fake NVML, MLflow's metric names,
exit status and signals passed through, and metrics landing in a real ``mlflow server``."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mlops_gpu.telemetry.launcher import Launcher
from mlops_gpu.telemetry.sampler import GpuSampler, visible_devices
from mlops_gpu.tracking.rest import MlflowRest, TrackingError, rest_uri

CLI = [sys.executable, "-m", "mlops_gpu.cli.main"]


class FakeNvml:
    """Four GPUs (index i: utilization 10*(i+1) %, (i+1) GiB used of 80, 100*(i+1) W, energy
    growing 1 kJ per call) and one MIG slice, whose power NVML does not report."""

    MIG = "MIG-5e1f0c2a-0000-0000-0000-000000000000"

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.energy = [0.0] * 5
        self.shutdown = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown += 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < 4:
            raise RuntimeError("Invalid Argument")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid == self.MIG:
            return 4
        if uuid.startswith("GPU-") and uuid[-1].isdigit():
            return int(uuid[-1])
        raise RuntimeError("Not Found")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=10 * (h + 1))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 4:
            raise RuntimeError("Not Supported")
        return 100_000 * (h + 1)  # milliwatts

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self.energy[h] += 1_000_000.0  # millijoules
        return int(self.energy[h])


def test_metrics_name_the_runs_devices_by_position_not_host_index() -> None:
    s = GpuSampler(visible_devices("2,3"), FakeNvml())
    samples = s.sample()
    m = {k: v for x in samples for k, v in x.metrics().items()}
    assert m["system/gpu_0_utilization_percentage"] == 30.0  # device 2
    assert m["system/gpu_1_utilization_percentage"] == 40.0  # device 3
    assert m["system/gpu_0_memory_usage_megabytes"] == 3 * 1024
    assert m["system/gpu_1_memory_usage_percentage"] == pytest.approx(100 * 4 / 80)
    assert m["system/gpu_0_power_usage_watts"] == 300.0
    assert not any(k.startswith("system/gpu_2") for k in m)


def test_gpu_and_mig_uuids_resolve_and_missing_values_are_left_out() -> None:
    s = GpuSampler(["GPU-aaaa-1", FakeNvml.MIG], FakeNvml())
    gpu, mig = s.sample()
    assert (gpu.device, gpu.utilization_pct, mig.utilization_pct) == ("GPU-aaaa-1", 20.0, 50.0)
    assert mig.power_w is None and "system/gpu_1_power_usage_watts" not in mig.metrics()


def test_no_driver_is_said_once_and_nothing_is_sampled() -> None:
    s = GpuSampler(["0"], FakeNvml(fail_init=True))
    assert not s.available and s.note.startswith("no NVML") and s.sample() == []
    err = io.StringIO()
    code = Launcher([sys.executable, "-c", "pass"], nvml=FakeNvml(fail_init=True), err=err).run()
    assert code == 0


def test_exit_status_and_signal_deaths_come_back(tmp_path: Path) -> None:
    assert Launcher([sys.executable, "-c", "raise SystemExit(3)"], err=io.StringIO()).run() == 3
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert Launcher([sys.executable, "-c", kill_self], err=io.StringIO()).run() == 128 + 9


def test_the_checkpoint_signal_reaches_the_child(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(42))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(30)\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.Popen([*CLI, "exec", "--", sys.executable, "-c", child], env=env)
    deadline = time.time() + 20
    while not ready.exists():
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR1)
    assert p.wait(timeout=20) == 42


def test_rest_uri_accepts_only_servers() -> None:
    assert rest_uri("http://127.0.0.1:5000/") == "http://127.0.0.1:5000"
    assert rest_uri("sqlite:///mlflow.db") is None and rest_uri(None) is None
    with pytest.raises(TrackingError, match="unreachable"):
        MlflowRest("http://127.0.0.1:9", timeout_s=2).experiment_id("x")


# -- against a real mlflow server (the ``mlflow_server`` fixture of conftest.py) ----------
def launch_into(server: str, name: str, nvml: FakeNvml) -> tuple[str, Launcher, io.StringIO]:
    """A new MLflow run on ``server`` and a launcher that ran a short child into it."""
    rest = MlflowRest(server)
    run_id = rest.create_run(rest.experiment_id("exec-test"), name)
    err = io.StringIO()
    child = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    launcher = Launcher(
        child, run_id=run_id, tracking_uri=server, interval_s=0.1, nvml=nvml, err=err
    )
    assert launcher.run() == 0
    return run_id, launcher, err


@pytest.mark.mlflow_server
def test_samples_land_in_the_mlflow_run(
    mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    run_id, launcher, _ = launch_into(mlflow_server, "train", FakeNvml())
    client = MlflowClient(mlflow_server)
    metrics = client.get_run(run_id).data.metrics
    assert metrics["system/gpu_0_utilization_percentage"] == 30.0
    assert metrics["system/gpu_1_utilization_percentage"] == 40.0
    assert metrics["system/gpu_1_power_usage_watts"] == 400.0
    assert metrics["mlops_gpu.mean_gpu_utilization"] == pytest.approx(35.0)
    n = len(launcher.samples)
    assert n >= 2 and metrics["mlops_gpu.energy_kwh"] == pytest.approx(2 * (n - 1) * 1000 / 3.6e6)
    history = client.get_metric_history(run_id, "system/gpu_0_utilization_percentage")
    assert [h.step for h in history] == list(range(n))


@pytest.mark.mlflow_server
def test_a_machine_without_nvml_tags_the_run_once(
    mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    run_id, launcher, err = launch_into(mlflow_server, "no-driver", FakeNvml(fail_init=True))
    assert err.getvalue().count("no NVML") == 1 and launcher.samples == []
    tags = MlflowClient(mlflow_server).get_run(run_id).data.tags
    assert tags["mlops_gpu.telemetry"].startswith("no NVML")


class IdleNvml(FakeNvml):
    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=0)


def short_launch(nvml: FakeNvml, seconds: float, **kw: Any) -> tuple[Launcher, int, str]:
    err = io.StringIO()
    child = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    launcher = Launcher(child, interval_s=0.05, nvml=nvml, err=err, idle_after_s=0.2, **kw)
    code = launcher.run()
    return launcher, code, err.getvalue()


def test_an_idle_run_is_flagged_once_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    launcher, code, err = short_launch(IdleNvml(), 0.8)
    assert code == 0 and launcher.idle and err.count("idle (under 1% utilization)") == 1


def test_an_idle_run_is_stopped_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    launcher, code, err = short_launch(IdleNvml(), 30, stop_idle=True)
    # a natural end would be 0: the SIGTERM status says the launcher stopped it
    assert launcher.idle and code == 128 + signal.SIGTERM and "stopping it" in err


def test_a_busy_run_is_not_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    launcher, code, err = short_launch(FakeNvml(), 0.6)
    assert code == 0 and not launcher.idle and "idle" not in err


@pytest.mark.mlflow_server
def test_the_idle_flag_is_a_tag_on_the_run(
    mlflow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    rest = MlflowRest(mlflow_server)
    run_id = rest.create_run(rest.experiment_id("exec-test"), "idle")
    launcher, code, _ = short_launch(IdleNvml(), 0.8, run_id=run_id, tracking_uri=mlflow_server)
    assert code == 0 and launcher.idle
    assert MlflowClient(mlflow_server).get_run(run_id).data.tags["mlops_gpu.idle"].endswith("Z")


class Child:
    """Stands in for the child process in ``_check_idle``: records signals."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def send_signal(self, n: int) -> None:
        self.signals.append(n)


def sample(*utils: float | None) -> list[Any]:
    from mlops_gpu.telemetry.sampler import GpuSample

    return [GpuSample(i, str(i), u, None, None, None, None) for i, u in enumerate(utils)]


def test_idle_time_counts_stretches_that_reach_the_window_only() -> None:
    now = [0.0]
    launcher = Launcher(["true"], err=io.StringIO(), clock=lambda: now[0], idle_after_s=100,
                        idle_below_pct=5.0)  # fmt: skip
    child = Child()

    def at(t: float, *utils: float | None) -> None:
        now[0] = t
        launcher._check_idle(sample(*utils), child, None)  # type: ignore[arg-type]

    at(0, 50, 50)
    at(10, 4, 3)  # both under 5%: a quiet stretch starts
    at(60, 4, 90)  # one device busy: the stretch (50 s) never reached the window
    assert launcher.idle_s == 0 and not launcher.idle
    at(70, 0, 0)
    at(170, 1, 0)  # 100 s quiet: flagged, counted from the stretch's start
    assert launcher.idle and launcher.idle_s == 100
    at(200, None, 0)  # a device that cannot say counts as busy: the stretch ends at 130 s
    assert launcher.idle_s == 130 and child.signals == []
    at(210, 0, 0)
    now[0] = 260
    assert launcher.idle_s == 130  # quiet for 50 s: not idle yet


def test_telemetry_file_has_the_summary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import json

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    f = tmp_path / "telemetry.json"
    launcher, code, _ = short_launch(IdleNvml(), 0.8, telemetry_file=str(f))
    data = json.loads(f.read_text())
    assert code == 0 and data["final"] and data["samples"] == len(launcher.samples) >= 3
    assert data["mean_utilization"] == 0.0 and data["idle_s"] >= 0.2
    assert data["idle_since"] is None  # the stretch closed when the child ended


@pytest.mark.parametrize("entry", ["cli", "launcher"])
def test_a_sigterm_is_passed_on_as_the_term_signal(tmp_path: Path, entry: str) -> None:
    """Kubernetes stops a pod with SIGTERM; the run gets its checkpoint signal instead."""
    ready = tmp_path / "ready"
    child = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(42))\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(15))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(30)\n"
    )
    head = (
        [*CLI, "exec"] if entry == "cli" else [sys.executable, "-m", "mlops_gpu.telemetry.launcher"]
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.Popen([*head, "--term-signal", "USR1", "--", sys.executable, "-c", child],
                         env=env, start_new_session=True)  # fmt: skip
    deadline = time.time() + 20
    while not ready.exists():
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 42


def test_an_unknown_term_signal_is_refused() -> None:
    r = subprocess.run([*CLI, "exec", "--term-signal", "SIGNOPE", "--", "true"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "unknown signal" in r.stderr
