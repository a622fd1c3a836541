"""Backends registered through the ``mlops_gpu.backends`` entry point group (``config.registry``).

A real distribution is installed for the test: a package and its ``.dist-info`` (METADATA and
entry_points.txt, as pip writes them) in a temporary folder put on ``sys.path`` of a fresh
interpreter, since the config's backend union is built once per process. Nothing is patched: the
config accepts the plugin's type through ``importlib.metadata``, the runtime makes the backend
through the builder the plugin's model names, and a scheduler tick launches a run on it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlops_gpu.config import backend_types
from mlops_gpu.config.registry import BUILTIN, GROUP

REPO = Path(__file__).resolve().parents[1]

MODEL = """
from typing import ClassVar, Literal

from pydantic import Field

from mlops_gpu.config import BackendConfigBase, NodeConfig


class EchoBackendConfig(BackendConfigBase):
    builder: ClassVar[str] = "echo_backend.backend:build"
    type: Literal["echo"]
    nodes: list[NodeConfig] = Field(min_length=1)
    greeting: str = "hello"

    def config_nodes(self) -> list[NodeConfig]:
        return self.nodes


class Misnamed(BackendConfigBase):
    builder: ClassVar[str] = "echo_backend.backend:build"
    type: Literal["other"]
"""

BACKEND = """
from mlops_gpu.backends.fake import FakeBackend


class EchoBackend(FakeBackend):
    def __init__(self, name, nodes, greeting):
        super().__init__(name, nodes, default_duration_s=1000)
        self.greeting = greeting
        self.launched = []

    def launch(self, req):
        self.launched.append(req.run_id)
        return super().launch(req)


def build(cfg, name):
    return EchoBackend(name, cfg.model_nodes(name), cfg.backends[name].greeting)
"""

SCRIPT = """
import sys

import yaml

from mlops_gpu.config import ConfigError, backend_types
from mlops_gpu.config.locate import parse_config
from mlops_gpu.testing import config_yaml, make_spec

data = yaml.safe_load(config_yaml(nodes=[("echo-node", 4)]))
nodes = data["backends"]["local"]["nodes"]
data["backends"] = {"e": {"type": "echo", "nodes": nodes, "greeting": "hi"}}
cfg = parse_config(data, "mlops-gpu.yaml", __import__("pathlib").Path(sys.argv[1]))
print("types", list(backend_types()))
print("model", type(cfg.backends["e"]).__name__)
# The model is pure data: no backend module (nor SDK) is imported to read the config.
print("lazy", "echo_backend.backend" not in sys.modules, "kubernetes" not in sys.modules)

from mlops_gpu.controller import Controller, Runtime

rt = Runtime(cfg)
b = rt.backends["e"]
print("backend", type(b).__module__, type(b).__name__, b.greeting)
print("inventory", [n.name for n in b.inventory()])
run = rt.submit(make_spec(gpus=2))
Controller(rt).tick()
print("launched", b.launched == [run.id], rt.store.get(run.id).phase.value)

for bad in ({"type": "echo", "nodes": nodes, "greeting": 5}, {"type": "nope", "nodes": nodes}):
    data["backends"] = {"e": bad}
    try:
        parse_config(data, "bad.yaml")
    except ConfigError as e:
        print("error", e)
"""


def install_plugin(root: Path, entry: str) -> None:
    """The plugin package and its dist-info (what ``pip install`` leaves in site-packages)."""
    pkg = root / "echo_backend"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(MODEL))
    (pkg / "backend.py").write_text(textwrap.dedent(BACKEND))
    info = root / "echo_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{entry}\n")
    (info / "RECORD").write_text("")


def run_with_plugin(tmp_path: Path, entry: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    install_plugin(site, entry)
    (tmp_path / "work").mkdir()
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path / "work")],
        env={**os.environ, "PYTHONPATH": path},
        cwd=tmp_path / "work",
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_plugin_backend_is_accepted_built_and_launched(tmp_path: Path) -> None:
    proc = run_with_plugin(tmp_path, "echo = echo_backend:EchoBackendConfig")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "types ['local', 'fake', 'slurm', 'kubernetes', 'echo']"
    assert out[1] == "model EchoBackendConfig"
    assert out[2] == "lazy True True"
    assert out[3] == "backend echo_backend.backend EchoBackend hi"
    assert out[4] == "inventory ['echo-node']"
    assert out[5] == "launched True running"
    # Errors name the file and the key as for a built-in (the type tag is no key of the file),
    # and an unknown type lists the plugin's among the expected ones.
    assert out[6].startswith("error bad.yaml: backends.e.greeting: Input should be a valid string")
    assert "'echo'" in out[7] and "'nope'" in out[7] and "'kubernetes'" in out[7]


def test_a_plugin_whose_type_is_not_its_name_stops_with_the_entry_point_named(
    tmp_path: Path,
) -> None:
    proc = run_with_plugin(tmp_path, "echo = echo_backend:Misnamed")
    assert proc.returncode != 0
    assert (
        "BackendRegistryError: entry point mlops_gpu.backends: echo = echo_backend:Misnamed"
        " (from echo-backend): Misnamed.type must be Literal['echo']"
    ) in proc.stderr


def test_a_plugin_may_not_take_a_built_in_name(tmp_path: Path) -> None:
    proc = run_with_plugin(tmp_path, "local = echo_backend:EchoBackendConfig")
    assert proc.returncode != 0
    assert "'local' is a built-in backend type; choose another name" in proc.stderr


def test_pyproject_registers_exactly_the_built_ins() -> None:
    # (a plain reading of the section: tomllib is Python 3.11+, the package supports 3.10)
    text = (REPO / "pyproject.toml").read_text()
    section = text.split(f'[project.entry-points."{GROUP}"]\n', 1)[1].split("\n\n", 1)[0]
    declared = dict(re.findall(r'^(\S+) = "([^"]+)"$', section, re.M))
    assert declared == {
        name: f"{cls.__module__}:{cls.__qualname__}" for name, cls in BUILTIN.items()
    }
    assert list(backend_types())[: len(BUILTIN)] == list(BUILTIN)


def test_the_installed_metadata_has_the_built_ins() -> None:
    from importlib.metadata import entry_points

    installed = {ep.name: ep for ep in entry_points(group=GROUP)}
    if not set(BUILTIN) <= set(installed):
        pytest.fail(f"the install predates the {GROUP} entry points: run `pip install -e .`")
    for name, cls in BUILTIN.items():
        assert installed[name].load() is cls
