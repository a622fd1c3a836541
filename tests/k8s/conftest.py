"""The real Kubernetes control plane for ``k8s``-marked tests: ``scripts/k8s.sh start`` (etcd,
kube-apiserver, kube-controller-manager and kwok with 100 fake GPU nodes on 127.0.0.1, built
from Go modules; idempotent). Where it cannot start, the tests skip, unless
``MLOPS_GPU_REQUIRE_K8S`` is set (CI), where they fail."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "k8s.sh"), "start"],
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    lines = [x for x in proc.stdout.splitlines() if x.startswith("KUBECONFIG=")]
    if proc.returncode != 0 or not lines:
        msg = f"scripts/k8s.sh could not start Kubernetes: {(proc.stderr or proc.stdout)[-800:]}"
        if os.environ.get("MLOPS_GPU_REQUIRE_K8S"):
            pytest.fail(msg)
        pytest.skip(msg)
    return lines[-1].split("=", 1)[1]


# the Slurm cluster's fixture too, for the test that spans all three backends
from slurm.conftest import slurm_conf  # noqa: E402, F401
