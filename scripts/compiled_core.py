"""The scheduling core compiled with mypyc: the same source, built into C extensions.

The core (``mlops_gpu/core``) and the model it reads (``mlops_gpu/model``) are pure, typed
Python; mypyc (part of mypy) compiles them as they are. The decisions are the same, only
faster (``benchmarks/core_throughput.py --core compiled``; ``tests/test_compiled_core.py``
checks both claims' first half on every test run). Nothing else is compiled: the rest of the
package is copied beside it unchanged.

    python scripts/compiled_core.py build    # print the directory to put first on PYTHONPATH

The build is cached under ``~/.cache/mlops-gpu/compiled-core/<key>`` (``build_cache``), where
the key hashes every ``mlops_gpu`` source file, the mypy version and the Python version: any
edit builds again (about a minute on two cores), nothing stale is ever imported. It needs mypy
(a test dependency) and a C compiler with the Python headers.

Invariants: a cache directory exists only complete (``build_cache.publish``); the compiled
modules are exactly ``MODULES``; the package under it is a copy of this checkout's
``mlops_gpu`` at the key's sources.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import build_cache

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mlops_gpu"
#: Compiled together, so that calls between them are native.
MODULES = ("core", "model")
#: mypyc type-checks what it compiles; the rest of the package (and mlflow, prefect, ...) is
#: not followed: their types are Any here (the full check is ``mypy --strict`` in the tests).
MYPY_INI = "[mypy]\nfollow_imports = skip\nignore_missing_imports = True\n"


def cache_root() -> Path:
    return build_cache.cache_root() / "compiled-core"


def key() -> str:
    import mypy.version

    h = hashlib.sha256()
    h.update(f"{mypy.version.__version__}\n{sys.version}\n{MYPY_INI}".encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(quiet: bool = True) -> Path:
    """The directory holding the compiled ``mlops_gpu`` (built when missing)."""
    out = cache_root() / key()
    if (out / "mlops_gpu").is_dir():
        return out
    mypyc = Path(sys.executable).with_name("mypyc")
    if not mypyc.exists():
        raise SystemExit(f"compiled_core: {mypyc} not found: install mypy (pip install mypy)")
    work = build_cache.workdir(out)
    try:
        shutil.copytree(PACKAGE, work / "mlops_gpu",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))  # fmt: skip
        (work / "mypyc.ini").write_text(MYPY_INI)
        files = sorted(
            str(p.relative_to(work)) for m in MODULES for p in (work / "mlops_gpu" / m).glob("*.py")
        )
        print(f"compiled_core: compiling {len(files)} modules with mypyc ...", file=sys.stderr)
        proc = subprocess.run([str(mypyc), "--config-file", "mypyc.ini", *files], cwd=work,
                              capture_output=quiet, text=True)  # fmt: skip
        if proc.returncode != 0:
            tail = ((proc.stdout or "") + (proc.stderr or ""))[-4000:]
            raise SystemExit(f"compiled_core: mypyc failed (exit {proc.returncode}):\n{tail}")
        for m in MODULES:  # the sources stay only where an extension did not replace them
            for p in (work / "mlops_gpu" / m).glob("*.py"):
                if not list(p.parent.glob(f"{p.stem}.*.so")):
                    raise SystemExit(f"compiled_core: no extension built for {p}")
        shutil.rmtree(work / "build", ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    build_cache.publish(work, out, out / "mlops_gpu")  # (about 8 MB a build)
    return out


def is_compiled() -> bool:
    """Whether the imported ``mlops_gpu.core`` is the compiled one."""
    import mlops_gpu.core.policy as policy

    return not str(policy.__file__).endswith(".py")


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    print(build(quiet=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
