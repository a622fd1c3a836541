"""The daemon loop ticks at once when another process changes the store (a submit, a cancel),
instead of waiting out ``tick_s``; with ``wake_s: 0`` it waits."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.config.locate import parse_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import Phase, ResourceRequest
from mlops_gpu.testing import config_yaml


def runtime(tmp_path: Path, wake_s: float) -> Runtime:
    data = yaml.safe_load(config_yaml(nodes=[("node-a", 4)], projects={"p": (4, 0)}))
    data["backends"] = {"fake": {"type": "fake", "nodes": data["backends"]["local"]["nodes"]}}
    data["scheduler"] = {"tick_s": 30, "wake_s": wake_s}
    data["mlflow"] = {"enabled": False}
    rt = Runtime(parse_config(data, str(tmp_path / "mlops-gpu.yaml"), tmp_path))
    rt.__dict__["backends"] = {"fake": FakeBackend("fake", rt.cfg.model_nodes("fake"))}
    return rt


@pytest.mark.parametrize(("wake_s", "woken"), [(0.05, True), (0.0, False)], ids=["wake", "off"])
def test_a_submit_from_another_process_starts_a_tick(
    tmp_path: Path, wake_s: float, woken: bool
) -> None:
    rt = runtime(tmp_path, wake_s)
    ctl = Controller(rt)
    stop = threading.Event()
    # a daemon thread: with wake_s 0 it sleeps out its 30 s tick after the test
    loop = threading.Thread(target=ctl.run_forever, kwargs={"should_stop": stop.is_set},
                            daemon=True)  # fmt: skip
    loop.start()
    try:
        time.sleep(0.5)  # the first tick is over: the loop waits (tick_s is 30 s)
        other = Runtime(rt.cfg)  # a second store connection, as the CLI's
        run = other.submit(other.spec(("x",), project="p", request=ResourceRequest(gpus=1),
                                      env={"FAKE_DURATION_S": "600"}))  # fmt: skip
        deadline = time.time() + 5
        while time.time() < deadline and other.store.get(run.id).phase is Phase.PENDING:
            time.sleep(0.05)
        # woken: admitted within 5 s of a 30 s tick period; off: still pending after 5 s
        assert (other.store.get(run.id).phase is not Phase.PENDING) is woken
    finally:
        stop.set()
        if woken:  # (the other loop sleeps out its tick; it is a daemon thread)
            loop.join(timeout=10)
