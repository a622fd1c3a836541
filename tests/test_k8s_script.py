"""``scripts/k8s.sh`` and its parts (``scripts/k8s/``) without a cluster: the Go wrapper modules
pin the versions the script builds by default, the build cache is keyed by the modules' content,
and the fake nodes are what the script's README says.

The cache tests run the real script on a copy of ``scripts/`` with a cache folder of their own,
holding executables in place of the binaries, and a ``go`` on PATH that only records that it
was called: a build that starts is seen without building anything.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
STAGES = re.findall(r'^STAGES="([^"]+)"$', (SCRIPTS / "k8s.sh").read_text(), re.M)[0].split()


def default(var: str) -> str:
    m = re.search(rf'"\${{{var}:-([^}}]+)}}"', (SCRIPTS / "k8s.sh").read_text())
    assert m, var
    return m.group(1)


def pin(module_dir: str, module: str) -> str:
    text = (SCRIPTS / "k8s" / module_dir / "go.mod").read_text()
    m = re.search(rf"^(?:require\s+|\t){re.escape(module)} (v\S+)$", text, re.M)
    assert m, module
    return m.group(1)


def test_the_default_versions_are_the_modules_pins() -> None:
    assert default("MLOPS_GPU_K8S_VERSION") == pin("kube", "k8s.io/kubernetes")
    assert default("MLOPS_GPU_ETCD_VERSION") == pin("etcd", "go.etcd.io/etcd/server/v3")
    # every staging module at the matching v0 release (what the published modules are)
    minor_patch = default("MLOPS_GPU_K8S_VERSION").split(".", 1)[1]
    kube = (SCRIPTS / "k8s" / "kube" / "go.mod").read_text()
    replaced = re.findall(r"^\t(k8s\.io/\S+) => (\S+) (v\S+)$", kube, re.M)
    assert len(replaced) > 20
    assert all(a == b and v == f"v0.{minor_patch}" for a, b, v in replaced)


def test_the_script_stays_small() -> None:
    assert len((SCRIPTS / "k8s.sh").read_text().splitlines()) < 300
    for part in (SCRIPTS / "k8s").glob("*.sh"):
        assert len(part.read_text().splitlines()) < 300, part


@pytest.fixture
def copy(tmp_path: Path) -> dict[str, Path]:
    """A copy of the script and its parts, a cache with stand-in binaries, a recording go."""
    scripts = tmp_path / "scripts"
    shutil.copytree(SCRIPTS / "k8s", scripts / "k8s")
    shutil.copy2(SCRIPTS / "k8s.sh", scripts / "k8s.sh")
    cache = tmp_path / "cache"
    kube = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    stand_ins = [f"bin/{default('MLOPS_GPU_K8S_VERSION')}/{c}" for c in kube]
    stand_ins += [f"bin/etcd-{default('MLOPS_GPU_ETCD_VERSION')}/etcd",
                  f"bin/kwok-{default('MLOPS_GPU_KWOK_VERSION')}/kwok"]  # fmt: skip
    for rel in stand_ins:
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_text("#!/bin/sh\nexit 0\n")
        (cache / rel).chmod(0o755)
    stages = cache / f"bin/kwok-{default('MLOPS_GPU_KWOK_VERSION')}/stages"
    stages.mkdir()
    for s in STAGES:
        (stages / f"{s}.yaml").write_text("kind: Stage\n")
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    calls = tmp_path / "go-calls"
    (fakebin / "go").write_text(f'#!/bin/sh\necho "$*" >>{calls}\necho "fake go: $*" >&2\nexit 1\n')
    (fakebin / "go").chmod(0o755)
    return {"scripts": scripts, "cache": cache, "fakebin": fakebin, "calls": calls}


def build(c: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLOPS_GPU_K8S_CACHE": str(c["cache"]),
           "MLOPS_GPU_K8S_DIR": str(c["cache"] / "run"),
           "PATH": f"{c['fakebin']}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    for var in ("MLOPS_GPU_K8S_VERSION", "MLOPS_GPU_ETCD_VERSION", "MLOPS_GPU_KWOK_VERSION"):
        env.pop(var, None)
    return subprocess.run(["bash", str(c["scripts"] / "k8s.sh"), "build"], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_warm_cache_is_kept_and_stamped_with_its_inputs(copy: dict[str, Path]) -> None:
    for _ in range(2):  # the first adopts the unstamped binaries, the second finds them stamped
        proc = build(copy)
        assert proc.returncode == 0, proc.stderr
        assert "all binaries present" in proc.stderr
    assert not copy["calls"].exists(), "a warm cache must not start a build"
    kube_stamp = copy["cache"] / "bin" / default("MLOPS_GPU_K8S_VERSION") / ".inputs"
    etcd_stamp = copy["cache"] / "bin" / f"etcd-{default('MLOPS_GPU_ETCD_VERSION')}" / ".inputs"
    assert re.fullmatch(r"[0-9a-f]{64}\n", kube_stamp.read_text())
    assert re.fullmatch(r"[0-9a-f]{64}\n", etcd_stamp.read_text())


def test_changed_module_files_rebuild_that_binary_only(copy: dict[str, Path]) -> None:
    assert build(copy).returncode == 0  # stamps the stand-ins
    with (copy["scripts"] / "k8s" / "kube" / "go.sum").open("a") as f:
        f.write("example.com/m v1.0.0 h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n")
    proc = build(copy)
    assert proc.returncode != 0
    assert "was built from other inputs than scripts/k8s/kube" in proc.stderr
    calls = copy["calls"].read_text().splitlines()
    # the build started (and failed at the stand-in go) for Kubernetes, not for etcd
    assert calls and all("etcd" not in call for call in calls), calls
    assert any(call.startswith("build ") and "kube-apiserver" in call for call in calls), calls
    k8s_bin = copy["cache"] / "bin" / default("MLOPS_GPU_K8S_VERSION")
    assert not list(k8s_bin.glob("kube-*")), "stale binaries must not survive a rebuild"
    assert (copy["cache"] / "bin" / f"etcd-{default('MLOPS_GPU_ETCD_VERSION')}" / "etcd").exists()


def test_fake_nodes_are_as_documented() -> None:
    spec = importlib.util.spec_from_file_location("k8s_nodes", SCRIPTS / "k8s" / "nodes.py")
    assert spec is not None and spec.loader is not None
    nodes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nodes)
    n0, n251 = nodes.node(0), nodes.node(251)
    assert n0["metadata"]["name"] == "kwok-node-0"
    assert n0["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert n0["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert n251["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert n0["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert n251["status"]["addresses"][0] == {"type": "InternalIP", "address": "10.240.1.2"}
    assert nodes.main(["bogus"]) == 2
