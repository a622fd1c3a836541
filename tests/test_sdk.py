"""The SDK from a notebook's point of view: submit commands and callables, wait, logs, result,
cancel, bad input, and the embedded default with no config and no daemon started by hand."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from conftest import stop_scheduler

import mlops_gpu as mg
from mlops_gpu.controller import SubmitError
from mlops_gpu.testing import config_yaml


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    p = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml())
    data["scheduler"] = {"tick_s": 0.1, "idle_exit_s": 3}
    p.write_text(yaml.safe_dump(data))
    yield p
    stop_scheduler(p)


def add(a: int, b: int) -> int:
    return a + b


def test_callable_and_command(cfg: Path) -> None:
    r = mg.submit(add, project="p", gpus=1, args=(2, 3), config=cfg)
    assert r.result(timeout=60) == 5 and r.status == "succeeded"
    c = mg.submit(
        "python -c 'import os; print(os.environ[\"CUDA_VISIBLE_DEVICES\"])'",
        project="p",
        gpus=2,
        config=cfg,
    )
    assert c.wait(timeout=60) == "succeeded"
    assert c.logs().strip() == ",".join(c.info()["devices"])
    assert mg.get_run(c.id, config=cfg).status == "succeeded"
    with pytest.raises(TypeError):
        c.result()


def test_failed_callable_raises(cfg: Path) -> None:
    def boom() -> None:
        raise ValueError("no convergence")

    r = mg.submit(boom, project="p", config=cfg)
    with pytest.raises(mg.RunFailed, match="no convergence"):
        r.result(timeout=60)


def test_wait_timeout_and_cancel_pending(cfg: Path) -> None:
    r = mg.submit("sleep 30", project="p", gpus=4, config=cfg, start_scheduler=False)
    with pytest.raises(TimeoutError):
        r.wait(timeout=0.3, poll_s=0.1)
    assert r.cancel() == "cancelled" and r.status == "cancelled"


@pytest.mark.parametrize(
    "kw",
    [{"gpus": 0}, {"gpus": 5}, {"project": "nope"}, {"gpu_type": "h100"}],
    ids=["zero", "too-many", "project", "gpu-type"],
)
def test_bad_requests_raise_and_queue_nothing(cfg: Path, kw: dict[str, object]) -> None:
    args = {"project": "p", **kw}
    with pytest.raises(SubmitError):
        mg.submit("true", config=cfg, start_scheduler=False, **args)  # type: ignore[arg-type]
    from mlops_gpu.config import load_config
    from mlops_gpu.state import Store

    assert Store(load_config(cfg).store_url).count() == 0


def test_embedded_default_without_any_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("MLOPS_GPU_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    r = mg.submit(add, project="default", args=(1, 1))
    user_cfg = tmp_path / "xdg" / "mlops-gpu" / "mlops-gpu.yaml"
    try:
        assert user_cfg.exists()
        t0 = time.time()
        assert r.result(timeout=60) == 2
        assert time.time() - t0 < 60
    finally:
        stop_scheduler(user_cfg)


def test_submit_many_queues_all_or_none(cfg: Path) -> None:
    from mlops_gpu.controller import Runtime
    from mlops_gpu.model import ResourceRequest

    rt = Runtime.load(cfg)
    ok = rt.spec(("true",), project="p", request=ResourceRequest(gpus=1))
    bad = rt.spec(("true",), project="nope", name="stray", request=ResourceRequest(gpus=1))
    with pytest.raises(SubmitError, match=r"1 of 3 runs rejected, none queued: run 1 \(stray\)"):
        rt.submit_many([ok, bad, ok])
    assert rt.store.count() == 0
    runs = rt.submit_many([ok, ok])
    assert rt.store.count() == 2 and [r.phase.value for r in runs] == ["pending", "pending"]
