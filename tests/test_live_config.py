"""Live config: a running scheduler follows its config file (``controller.config_watch``).

The end-to-end test runs ``mlops-gpu scheduler`` as a real process on the local backend and
edits its file under it: a project added by the edit gets its run started, a bad edit is refused
with one log line while the loaded config keeps running, SIGHUP re-reads an edit the file's
stat cannot show. The unit tests drive ``ConfigWatch`` and the controller in-process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_cli

from mlops_gpu.config import load_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.controller.config_watch import ConfigWatch, apply
from mlops_gpu.model import Phase
from mlops_gpu.testing import config_yaml, make_spec

QUICK = {"mlflow": {"enabled": False}, "scheduler": {"tick_s": 0.2}}


def _write(cfg: Path, projects: dict[str, tuple[int, int | None]]) -> None:
    cfg.write_text(config_yaml(projects=projects, extra=QUICK))


def _wait(pred: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _phase(cfg: Path, run_id: str) -> str:
    r = run_cli("--config", str(cfg), "status", run_id, "--json")
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)[0]["phase"])


def _sched_status(cfg: Path) -> dict[str, Any]:
    r = run_cli("--config", str(cfg), "scheduler", "status", "--json")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def test_running_scheduler_follows_config_edits(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    _write(cfg, {"p": (4, 0)})
    log_path = tmp_path / "scheduler.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlops_gpu.cli.main", "--config", str(cfg), "scheduler"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait(lambda: "scheduler started" in log_path.read_text(), "the scheduler to start")
        # 1. an edit adds project vision: a run submitted to it starts, no restart
        _write(cfg, {"p": (4, 0), "vision": (2, 0)})
        r = run_cli("--config", str(cfg), "submit", "--project", "vision", "--no-start",
                    "--", sys.executable, "-c", "pass")  # fmt: skip
        assert r.returncode == 0, r.stderr
        first = r.stdout.strip()
        _wait(lambda: _phase(cfg, first) == "succeeded", "the run of the added project")
        loaded = _sched_status(cfg)["config"]["sha256"]

        # 2. a bad edit (vision's quota negative): refused with ONE line naming the file and
        # the key; the loaded config (vision with 2 GPUs) keeps running
        text = cfg.read_text()
        good = _good(cfg, text)  # (the CLI refuses the bad file: reads go through a copy)
        bad = text.replace("nominal: 2", "nominal: -2")
        assert bad != text
        cfg.write_text(bad)
        key = "projects.vision.quotas.a100-80gb.nominal"
        _wait(lambda: key in log_path.read_text(), "the refusal in the log")
        time.sleep(1.5)  # several more ticks: still one line
        refusals = [ln for ln in log_path.read_text().splitlines() if key in ln]
        assert len(refusals) == 1, refusals
        assert str(cfg.resolve()) in refusals[0] and "greater than or equal to 0" in refusals[0]
        st = _sched_status(good)
        assert st["running"] and st["config"]["sha256"] == loaded
        assert key in st["config"]["error"] and st["config"]["file_changed"]
        assert proc.poll() is None
        # queue a run the way another client would (the CLI refuses the bad file)
        rt = Runtime(load_config(good))
        run = rt.store.submit(make_spec(project="vision", gpus=2, command=(sys.executable,
                              "-c", "pass"), workdir=str(tmp_path)))  # fmt: skip
        _wait(lambda: _phase(good, run.id) == "succeeded", "a run under the loaded config")

        # 3. SIGHUP: an edit the stat cannot see (same size, mtime and inode) is read on
        # SIGHUP only. It renames project p to q (same length)
        cfg.write_text(text)  # the good version again (the loaded one: nothing to apply)
        _wait(lambda: not _sched_status(cfg)["config"]["error"], "the refusal cleared")
        st0 = os.stat(cfg)
        renamed = text.replace("\n  p:\n", "\n  q:\n")
        assert renamed != text and len(renamed) == len(text)
        with open(cfg, "r+") as f:  # in place: same inode
            f.write(renamed)
        os.utime(cfg, ns=(st0.st_atime_ns, st0.st_mtime_ns))
        r = run_cli("--config", str(cfg), "submit", "--project", "q", "--no-start",
                    "--", sys.executable, "-c", "pass")  # fmt: skip
        assert r.returncode == 0, r.stderr
        third = r.stdout.strip()
        time.sleep(1.5)
        assert _phase(cfg, third) == "pending"  # the scheduler still runs the old file
        proc.send_signal(signal.SIGHUP)
        _wait(lambda: _phase(cfg, third) == "succeeded", "the run after SIGHUP")
        assert _sched_status(cfg)["config"]["sha256"] != loaded
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0


def _good(cfg: Path, text: str) -> Path:
    """A copy of the good config beside ``cfg`` (same folder: same store and state)."""
    good = cfg.with_name("good.yaml")
    good.write_text(text)
    return good


def test_bad_edit_is_logged_once_per_version_and_the_old_config_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    _write(cfg, {"p": (4, 0)})
    watch = ConfigWatch(load_config(cfg))
    assert watch.check() is None  # unchanged
    caplog.set_level(logging.INFO, logger="mlops_gpu.config")
    cfg.write_text(cfg.read_text() + "bogus_key: 1\n")
    for _ in range(5):
        assert watch.check() is None
        watch.request()  # even forced re-reads do not log it again
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "bogus_key: unknown key" in errors[0].getMessage()
    assert watch.current.projects.keys() == {"p"}
    cfg.write_text(cfg.read_text() + "bogus_key2: 1\n")  # another bad version: its own line
    assert watch.check() is None
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 2
    _write(cfg, {"p": (4, 0), "vision": (1, 0)})
    new = watch.check()
    assert new is not None and set(new.projects) == {"p", "vision"} and watch.error is None


def test_restart_only_sections_keep_their_loaded_values(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    _write(cfg, {"p": (4, 0)})
    watch = ConfigWatch(load_config(cfg))
    data = yaml.safe_load(cfg.read_text())
    data["backends"]["local"]["nodes"][0]["gpus"] = 8
    data["projects"]["p"]["quotas"]["a100-80gb"]["nominal"] = 8
    cfg.write_text(yaml.safe_dump(data))
    caplog.set_level(logging.INFO, logger="mlops_gpu.config")
    new = watch.check()
    assert new is not None
    assert new.projects["p"].quotas["a100-80gb"].nominal == 8  # applied
    assert new.backends["local"].nodes[0].gpus == 4  # at the next restart
    assert watch.restart_needed == ("backends",)
    assert any("backends changed" in r.getMessage() for r in caplog.records)
    # an edit whose live part contradicts the running backends is refused as a whole
    data["gpu_types"] = {"h100": {"price_per_hour": 4.0}}
    data["projects"]["p"]["quotas"] = {"h100": {"nominal": 8}}
    data["backends"]["local"]["nodes"][0]["gpu_type"] = "h100"
    cfg.write_text(yaml.safe_dump(data))
    assert watch.check() is None
    assert watch.error is not None and "unknown GPU type 'a100-80gb'" in watch.error


@pytest.mark.parametrize("engine", ["python", "native"])
def test_invalid_run_becomes_schedulable_when_the_config_names_its_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, engine: str
) -> None:
    from mlops_gpu.engines import native

    if engine == "python":
        monkeypatch.setattr(native, "_engine", None)  # as installed without cargo
    else:
        request.getfixturevalue("native_module")
    cfg = tmp_path / "mlops-gpu.yaml"
    _write(cfg, {"p": (4, 0)})
    rt = Runtime(load_config(cfg))
    run = rt.store.submit(make_spec(project="vision", command=(sys.executable, "-c", "pass"),
                                    workdir=str(tmp_path)))  # fmt: skip
    ctl, watch = Controller(rt), ConfigWatch(rt.cfg)
    rep = ctl.tick()
    assert type(ctl.mirror.engine).__name__ == ("NativeEngine" if engine == "native" else
                                                "FromScratch")  # fmt: skip
    got = rt.store.get(run.id)
    assert rep.invalid == 1 and got is not None and got.reason_code == "invalid"
    _write(cfg, {"p": (4, 0), "vision": (1, 0)})  # (another size: the stat shows it)
    new = watch.check()
    assert new is not None
    apply(ctl, new)
    rep = ctl.tick()
    assert type(ctl.mirror.engine).__name__ == ("NativeEngine" if engine == "native" else
                                                "FromScratch")  # fmt: skip
    got = rt.store.get(run.id)
    assert rep.admitted == 1 and got is not None and got.phase is not Phase.PENDING
    ctl.release()


def test_invalid_runs_do_not_keep_an_idle_scheduler_running(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    _write(cfg, {"p": (4, 0)})
    rt = Runtime(load_config(cfg))
    rt.store.submit(make_spec(project="nowhere", command=("true",), workdir=str(tmp_path)))
    ctl = Controller(rt)
    stop = threading.Event()
    t = threading.Thread(
        target=lambda: ctl.run_forever(tick_s=0.05, idle_exit_s=0.3, should_stop=stop.is_set)
    )
    t0 = time.monotonic()
    t.start()
    t.join(timeout=10)
    stop.set()
    t.join()
    assert time.monotonic() - t0 < 10, "a pending invalid run kept the scheduler from exiting"
    ctl.release()


def test_sdk_submits_check_the_config_as_edited(tmp_path: Path) -> None:
    from mlops_gpu.sdk import submit

    cfg = tmp_path / "mlops-gpu.yaml"
    _write(cfg, {"p": (4, 0)})
    kw: dict[str, Any] = {"config": cfg, "start_scheduler": False, "workdir": str(tmp_path)}
    submit("true", project="p", **kw)  # (the runtime is cached from here)
    with pytest.raises(ValueError, match="unknown project 'vision'"):
        submit("true", project="vision", **kw)
    _write(cfg, {"p": (4, 0), "vision": (1, 0)})
    assert submit("true", project="vision", **kw).status == "pending"
