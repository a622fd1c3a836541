"""Two build options beside pyproject.toml; without them, the default, the package is pure
Python. Neither is for editable installs (extensions built in place would shadow the sources
being edited).

``MLOPS_GPU_COMPILE=1`` compiles the scheduling core (``mlops_gpu/core`` and
``mlops_gpu/model``) with mypyc, as ``scripts/compiled_core.py`` does for the tests and
benchmarks (same decisions, about twice the cycle throughput):

    pip install mypy wheel && MLOPS_GPU_COMPILE=1 pip install --no-build-isolation .

``MLOPS_GPU_BUILD_NATIVE=1`` builds the native engine (``native/``, Rust) with cargo, as
``scripts/native_core.py`` does, into the package (``mlops_gpu/core/mlops_gpu_native.so``),
where ``mlops_gpu.core.native.installed()`` finds it (same decisions, about 20 times the
cycle throughput of the Python core):

    MLOPS_GPU_BUILD_NATIVE=1 pip install .
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


def compiled_extensions() -> list[object]:
    if os.environ.get("MLOPS_GPU_COMPILE") != "1":
        return []
    if {"develop", "editable_wheel"} & set(sys.argv):
        sys.exit("MLOPS_GPU_COMPILE=1 is for `pip install .`, not editable installs")
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit(
            "MLOPS_GPU_COMPILE=1: mypyc (part of mypy) is not in the build environment; run "
            "`pip install mypy wheel`, then "
            "`MLOPS_GPU_COMPILE=1 pip install --no-build-isolation .`"
        )
    sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
    from compiled_core import MODULES, MYPY_INI

    ini = Path(tempfile.mkdtemp(prefix="mlops-gpu-mypyc-")) / "mypyc.ini"
    ini.write_text(MYPY_INI)
    files = sorted(str(p) for m in MODULES for p in Path("mlops_gpu", m).glob("*.py"))
    return list(mypycify(["--config-file", str(ini), *files], opt_level="3"))


def _native() -> bool:
    if os.environ.get("MLOPS_GPU_BUILD_NATIVE") != "1":
        return False
    if {"develop", "editable_wheel"} & set(sys.argv):
        sys.exit("MLOPS_GPU_BUILD_NATIVE=1 is for `pip install .`, not editable installs")
    return True


class BuildPy(build_py):
    """The pure-Python build, plus the native engine's library when asked for."""

    def run(self) -> None:
        super().run()
        if not _native():
            return
        sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
        import native_core

        built = native_core.build(quiet=False)
        dest = Path(self.build_lib) / "mlops_gpu" / "core" / f"{native_core.NAME}.so"
        self.copy_file(str(built), str(dest))


class MaybeBinary(Distribution):
    """A wheel with the native library in it is for this platform only."""

    def has_ext_modules(self) -> bool:
        return _native() or super().has_ext_modules()


setup(ext_modules=compiled_extensions(), cmdclass={"build_py": BuildPy}, distclass=MaybeBinary)
