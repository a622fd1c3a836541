"""The scheduler's memory of ended runs stays bounded (``Gated.forget_ended``, set by the
mirror): after many runs end, it keeps only the ends a pending run names, and a run submitted
later that depends on a long-ended run is still judged right, from the store."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import run_cli

from mlops_gpu.config import load_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import TERMINAL_PHASES, Phase
from mlops_gpu.testing import config_yaml


def submit(cfg: Path, *args: str) -> str:
    r = run_cli("--config", str(cfg), "submit", "--no-start", "-p", "p", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def until_ended(ctl: Controller, rt: Runtime, ids: list[str]) -> None:
    deadline = time.time() + 120
    while not all((r := rt.store.get(i)) is not None and r.phase in TERMINAL_PHASES for i in ids):
        assert time.time() < deadline
        ctl.tick()
        time.sleep(0.05)


def test_ended_runs_are_forgotten_and_a_late_dependent_asks_the_store(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    extra = {"telemetry": {"launcher": False}, "mlflow": {"enabled": False}}
    cfg.write_text(config_yaml(nodes=[("node-a", 8)], projects={"p": (8, 0)}, extra=extra))
    ok = submit(cfg, "--", "true")
    bad = submit(cfg, "--", "false")
    rest = submit(cfg, "--array", "0-29", "--", "true")
    rt = Runtime(load_config(str(cfg)))
    ctl = Controller(rt)
    until_ended(ctl, rt, [ok, bad] + [f"{rest}_{i}" for i in range(30)])
    ctl.tick()
    gate = ctl.mirror.gate
    assert gate is not None and gate.forget_ended
    assert gate.ended_phase == {}  # 32 runs ended; no pending run names one
    late_ok = submit(cfg, "--afterok", ok, "--", "true")
    late_bad = submit(cfg, "--afterok", bad, "--", "true")
    until_ended(ctl, rt, [late_ok, late_bad])
    a, b = rt.store.get(late_ok), rt.store.get(late_bad)
    assert a is not None and a.phase is Phase.SUCCEEDED
    assert b is not None and b.phase is Phase.CANCELLED
    assert f"run {bad} failed (afterok needs it to succeed)" in (b.reason or "")
    ctl.tick()
    after = ctl.mirror.gate
    assert after is not None and after.ended_phase == {}
