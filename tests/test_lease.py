"""``mg.gpus``: GPUs of the local backend held by the caller for a block, under the project's
quota; their devices in ``current_gpus()`` and ``CUDA_VISIBLE_DEVICES``; released on exit
(``succeeded``, or ``failed`` when the block raised), and when the holder dies; ``lease.call``
runs a function in a child that sees exactly the lease's devices; inside a scheduled run, a
lease is carved from the run's own devices first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import stop_scheduler

import mlops_gpu as mg
from mlops_gpu.testing import config_yaml


@pytest.fixture
def cfg(tmp_path: Path):  # type: ignore[no-untyped-def]
    p = tmp_path / "mlops-gpu.yaml"
    data = yaml.safe_load(config_yaml(projects={"p": (2, 0)}))
    data["scheduler"] = {"tick_s": 0.1, "idle_exit_s": 5}
    p.write_text(yaml.safe_dump(data))
    yield p
    stop_scheduler(p)


def test_a_lease_sets_the_devices_for_the_block_and_gives_them_back(cfg: Path) -> None:
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    with mg.gpus(2, project="p", config=cfg, timeout=60) as lease:
        assert len(lease.devices) == 2
        assert mg.current_gpus() == lease.devices
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(lease.devices)
        run = lease.run
        assert run.status in ("starting", "running")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and mg.current_gpus() is None
    assert run.status == "succeeded"  # ended as the block did, its GPUs free


def test_a_finished_lease_is_succeeded_and_a_raising_block_failed(cfg: Path) -> None:
    from mlops_gpu.controller import Runtime

    with mg.gpus(1, project="p", config=cfg, timeout=60) as lease:
        pass
    ok = lease.run.record
    assert (ok.phase.value, ok.exit_code) == ("succeeded", 0), ok.reason
    with pytest.raises(ZeroDivisionError), mg.gpus(1, project="p", config=cfg, timeout=60) as bad:
        1 / 0  # noqa: B018 - the block raises
    failed = bad.run.record
    assert failed.phase.value == "failed" and "cancel" not in (failed.reason or "")
    events = " ".join(f"{e.kind} {e.reason}" for e in Runtime.load(cfg).store.events(ok.id))
    assert "cancel" not in events  # a finished lease is not a cancel


def test_call_runs_in_a_child_that_sees_exactly_the_lease_devices(cfg: Path) -> None:
    def seen(tag: str) -> tuple[str, str | None, tuple[str, ...] | None, int]:
        return tag, os.environ.get("CUDA_VISIBLE_DEVICES"), mg.current_gpus(), os.getpid()

    def boom() -> None:
        raise ValueError("from the child")

    with mg.gpus(1, project="p", config=cfg, timeout=60, set_env=False) as lease:
        tag, visible, current, pid = lease.call(seen, "x")
        with pytest.raises(ValueError, match="from the child"):
            lease.call(boom)
    assert tag == "x" and pid != os.getpid()
    assert visible == ",".join(lease.devices) and current == lease.devices


def _nested(n: int, config: str) -> dict[str, object]:
    """Inside a 2-GPU run: two 1-GPU leases at once, from threads."""
    out: dict[str, object] = {"own": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def take(i: int) -> None:
        with mg.gpus(1, project="p", config=config, timeout=20) as lease:
            time.sleep(0.5)
            out[f"lease{i}"] = (lease.devices, lease.run is None)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_leases_inside_a_run_are_carved_from_its_devices_first(cfg: Path) -> None:
    from mlops_gpu.controller import Runtime

    run = mg.submit(_nested, project="p", gpus=2, args=(2, str(cfg)), config=cfg)
    out = run.result(timeout=120)
    own = set(str(out["own"]).split(","))
    (d0, carved0), (d1, carved1) = out["lease0"], out["lease1"]  # type: ignore[misc]
    assert carved0 and carved1  # no lease queued: the quota of 2 is the run's
    assert set(d0) | set(d1) == own and not set(d0) & set(d1)
    assert [r.id for r in Runtime.load(cfg).store.list_runs()] == [run.id]


def test_two_leases_in_threads_respect_the_quota(cfg: Path) -> None:
    spans: list[tuple[float, float, tuple[str, ...] | None]] = []

    def hold() -> None:
        with mg.gpus(2, project="p", config=cfg, timeout=60):
            t0 = time.monotonic()
            time.sleep(1.0)
            spans.append((t0, time.monotonic(), mg.current_gpus()))

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    (_, a1, da), (b0, _, db) = sorted(spans)
    assert a1 <= b0  # one at a time: 2 GPUs each against a quota of 2
    assert da is not None and db is not None and len(da) == len(db) == 2


def test_a_lease_ends_with_its_holder(cfg: Path, tmp_path: Path) -> None:
    code = (
        "import sys, time, mlops_gpu as mg\n"
        f"lease = mg.gpus(1, project='p', config={str(cfg)!r}, timeout=60).__enter__()\n"
        "print(lease.run.id, flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    run_id = holder.stdout.readline().strip()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    run = mg.get_run(run_id, config=cfg)
    assert run.wait(timeout=60) == "succeeded"  # the hold job saw its holder go and ended


def test_without_a_local_backend_a_lease_says_so(tmp_path: Path) -> None:
    data = yaml.safe_load(config_yaml())
    data["backends"] = {"f": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    p = tmp_path / "fake.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(mg.LeaseError, match="local backend"):
        mg.gpus(1, project="p", config=p).__enter__()
