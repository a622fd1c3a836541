"""The Job manifest of each shape of run (golden files in ``golden/``;
``MLOPS_GPU_UPDATE_GOLDEN=1`` rewrites them), and names with odd characters turned into valid
DNS-1123 names and label values. No cluster needed."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from mlops_gpu.backends import LaunchError, LauncherSettings, LaunchRequest
from mlops_gpu.backends.k8s_manifest import PodSettings, dns_label, job_manifest, label_value
from mlops_gpu.model import CheckpointPolicy, NodeSlot, Placement, ResourceRequest
from mlops_gpu.testing import make_spec

GOLDEN = Path(__file__).with_name("golden")
POD = PodSettings(namespace="ml", image="registry.local/train:1", python="/usr/bin/python3",
                  env={"HF_HOME": "/cache"}, annotations={"team": "vision"})  # fmt: skip
ENV = {"MLOPS_GPU_RUN_ID": "r0123456789", "MLOPS_GPU_ATTEMPT": "1"}


def placement(gpu_type: str, *slots: tuple[str, tuple[str, ...]]) -> Placement:
    return Placement("k8s", gpu_type, tuple(NodeSlot(n, d) for n, d in slots))


SHAPES = {
    "one-node-4gpu": LaunchRequest(
        "r0123456789", 1,
        replace(make_spec(gpus=4, command=("python", "train.py")), name="résumé: \"v2\" $(x)",
                checkpoint=CheckpointPolicy(signal="SIGUSR1", grace_s=45)),
        placement("a100-80gb", ("kwok-node-3", ("0", "1", "2", "3"))), launcher=LauncherSettings(),
    ),
    "gang-2x1": LaunchRequest(
        "r0123456789", 2, make_spec(gpus=1, command=("torchrun", "train.py")),
        placement("h100-80gb", ("kwok-node-7", ("0",)), ("kwok-node-9", ("0",))),
        launcher=LauncherSettings(interval_s=5),
    ),
    "mig-bare-max-runtime": LaunchRequest(
        "r0123456789", 1,
        replace(make_spec(gpus=1, command=("python", "eval.py")), max_runtime_s=600,
                request=ResourceRequest(gpus=1, mig="1g.10gb", cpu_milli=2500,
                                        host_memory_mb=4096), workdir="/work"),
        placement("a100-80gb", ("kwok-node-1", ("MIG-0",))),
    ),
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_golden(shape: str) -> None:
    text = json.dumps(job_manifest(SHAPES[shape], POD, ENV), indent=1, sort_keys=True,
                      ensure_ascii=False) + "\n"  # fmt: skip
    golden = GOLDEN / f"{shape}.json"
    if os.environ.get("MLOPS_GPU_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


LABEL = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


@pytest.mark.parametrize("text", ["résumé: \"v2\" $(x)", "--", "a" * 100, "Train/ViT_L.16",
                                  "", "✓✓✓", "-x-", "`rm -rf /`\nnext"])  # fmt: skip
def test_odd_names_become_valid_labels_and_dns_names(text: str) -> None:
    v = label_value(text)
    assert len(v) <= 63 and LABEL.match(v), v
    d = dns_label(text)
    assert 1 <= len(d) <= 63 and DNS.match(d), d


def test_the_run_name_is_kept_whole_in_an_annotation() -> None:
    m = job_manifest(SHAPES["one-node-4gpu"], POD, ENV)
    assert m["metadata"]["annotations"]["mlops-gpu/run-name"] == 'résumé: "v2" $(x)'
    assert m["metadata"]["labels"]["mlops-gpu/name"] == "r-sum-v2-x"
    assert m["spec"]["template"]["spec"]["nodeName"] == "kwok-node-3"
    # the kubelet's SIGTERM reaches the run as its checkpoint signal
    assert "--term-signal" in m["spec"]["template"]["spec"]["containers"][0]["command"]


def test_bad_env_names_and_uneven_gangs_are_refused() -> None:
    with pytest.raises(LaunchError, match="not valid in a pod"):
        job_manifest(SHAPES["gang-2x1"], POD, {"BAD NAME": "x"})
    two_and_one = placement("h100-80gb", ("a", ("0", "1")), ("b", ("0",)))
    uneven = replace(SHAPES["gang-2x1"], placement=two_and_one)
    with pytest.raises(LaunchError, match="same GPUs"):
        job_manifest(uneven, POD, ENV)
