"""One build option beside pyproject.toml: ``MLOPS_GPU_COMPILE=1`` compiles the scheduling core
(``mlops_gpu/core`` and ``mlops_gpu/model``) with mypyc, as ``scripts/compiled_core.py`` does
for the tests and benchmarks (same decisions, about twice the cycle throughput). Without
it, the default, the package is pure Python. Not for editable installs: extensions built in
place would shadow the sources being edited.

    pip install mypy wheel && MLOPS_GPU_COMPILE=1 pip install --no-build-isolation .
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from setuptools import setup


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


setup(ext_modules=compiled_extensions())
