"""The ordinary install without a Rust toolchain: ``pip install .`` into a fresh virtual
environment whose PATH has no cargo still succeeds (setuptools-rust's extension is optional),
builds no ``mlops_gpu._engine``, and ``mlops-gpu demo`` then runs on the Python engine and says
so once, with what it costs.

The fresh environment borrows the test environment's installed dependencies (a ``.pth`` line:
no download of mlflow and the rest), but installs mlops-gpu itself from a copy of this
checkout's files, the way a user's ``pip install .`` does (the build back end and
setuptools-rust come from pip's cache or the package index).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from mlops_gpu.engines.native import PYTHON_ENGINE_WARNING

REPO = Path(__file__).resolve().parents[1]


def _checkout_copy(dest: Path) -> Path:
    """The checkout's tracked and new (not ignored) files, as a fresh clone would have them."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.slow
def test_install_without_cargo_succeeds_and_the_demo_runs_on_python(tmp_path: Path) -> None:
    src = _checkout_copy(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(site, "_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # PATH with this Python's environment and the system's tools, and no cargo anywhere on it
    path = os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    env = {**os.environ, "PATH": path, "HOME": str(tmp_path / "home")}
    for var in ("CARGO", "CARGO_HOME", "RUSTUP_HOME", "VIRTUAL_ENV", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    assert shutil.which("cargo", path=path) is None, "this machine has cargo on the system PATH"
    inst = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "."],
        cwd=src, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert inst.returncode == 0, (inst.stdout + inst.stderr)[-4000:]
    probe = subprocess.run(
        [str(py), "-c", "from mlops_gpu.engines import native; import mlops_gpu; "
         "print(native.installed(), mlops_gpu.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-4000:]
    none, where = probe.stdout.split()
    assert none == "None" and where.startswith(str(venv)), probe.stdout
    assert Path(where).with_name("_engine.pyi").is_file()  # the stubs ship (py.typed)
    # the web dashboard's templates and static files ship as package data
    dash = Path(where).parent / "server" / "dashboard"
    for name in ("templates/base.html", "templates/queue.html", "templates/cluster.html",
                 "static/dash.css", "static/dash.js"):  # fmt: skip
        assert (dash / name).is_file(), f"{name} missing from the installed package"
    demo = subprocess.run(
        [str(venv / "bin" / "mlops-gpu"), "demo", "--dir", str(tmp_path / "demo")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, (demo.stdout + demo.stderr)[-4000:]
    assert "Per-project summary" in demo.stdout
    assert (demo.stdout + demo.stderr).count(PYTHON_ENGINE_WARNING) == 1, demo.stderr[-4000:]
