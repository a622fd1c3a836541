"""``mlops-gpu init`` from what NVML finds, through the telemetry seam (a fake NVML)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import yaml

from mlops_gpu.config.locate import parse_config
from mlops_gpu.config.starter import starter_config
from mlops_gpu.controller.setup import starter_nodes
from mlops_gpu.telemetry import discover_gpus, gpu_type_name


class FakeNvml:
    def __init__(self, gpus: list[tuple[str, int]], fail: bool = False) -> None:
        self.gpus, self.fail, self.shutdown = gpus, fail, 0

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h][0].encode()

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:04d}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=self.gpus[h][1] * 1024**3)


def test_discovery_through_the_seam() -> None:
    fake = FakeNvml([("NVIDIA A100-SXM4-80GB", 80), ("NVIDIA A100-SXM4-80GB", 80)])
    found = discover_gpus(fake)
    assert found is not None
    assert [(g.index, g.uuid, g.gpu_type) for g in found] == [
        (0, "GPU-0000", "a100-80gb"),
        (1, "GPU-0001", "a100-80gb"),
    ]
    assert fake.shutdown == 1


def test_no_driver_means_none_and_virtual_gpus() -> None:
    assert discover_gpus(FakeNvml([], fail=True)) is None
    nodes, why = starter_nodes(None, "a100-80gb", nvml=FakeNvml([], fail=True))
    assert "virtual" in why and nodes[0].devices is None and nodes[0].gpus == 4


def test_init_config_from_mixed_gpus_validates() -> None:
    fake = FakeNvml([("NVIDIA H100 80GB HBM3", 80), ("NVIDIA L4", 23), ("NVIDIA L4", 23)])
    nodes, why = starter_nodes(None, "ignored", nvml=fake)
    assert "found 3 GPU(s)" in why
    assert sorted((n.gpu_type, tuple(n.devices or ())) for n in nodes) == [
        ("h100-80gb", ("0",)),
        ("l4-23gb", ("1", "2")),
    ]
    cfg = parse_config(yaml.safe_load(starter_config(nodes, source="t", cohort=None)), "x.yaml")
    assert {n.gpu_type for b in cfg.backends for n in cfg.model_nodes(b)} == {
        "h100-80gb",
        "l4-23gb",
    }


def test_gpu_type_names() -> None:
    assert gpu_type_name("NVIDIA GeForce RTX 4090", 23.99) == "rtx-4090-24gb"
    assert gpu_type_name("Tesla V100-SXM2-16GB", 16) == "v100-16gb"


def test_example_config_validates() -> None:
    from pathlib import Path

    from mlops_gpu.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "examples" / "mlops-gpu.yaml")
    assert set(cfg.projects) == {"vision", "nlp"}
    assert sum(n.capacity for n in cfg.model_nodes("local")) == 6
