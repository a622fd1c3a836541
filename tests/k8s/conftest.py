"""The real Kubernetes control plane for ``k8s``-marked tests: ``scripts/k8s.sh start`` (etcd,
kube-apiserver, kube-controller-manager and kwok with 100 fake GPU nodes on 127.0.0.1, built
from Go modules; idempotent). Where it cannot start, the tests skip, unless
``MLOPS_GPU_REQUIRE_K8S`` is set (CI), where they fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import start_service

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    return start_service("k8s.sh", "Kubernetes", "MLOPS_GPU_REQUIRE_K8S", 3600, key="KUBECONFIG")


# the Slurm cluster's fixture too, for the test that spans all three backends
from slurm.conftest import slurm_conf  # noqa: E402, F401
