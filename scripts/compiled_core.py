"""The scheduling core compiled with mypyc: the same source, built into C extensions.

The core (``mlops_gpu/core``) and the model it reads (``mlops_gpu/model``) are pure, typed
Python; mypyc (part of mypy) compiles them as they are. The decisions are the same, only
faster (``benchmarks/core_throughput.py --core compiled``; ``tests/test_compiled_core.py``
checks both claims' first half on every test run). Nothing else is compiled: the rest of the
package is copied beside it unchanged.

    python scripts/compiled_core.py build    # print the directory to put first on PYTHONPATH

The build is cached under ``~/.cache/mlops-gpu/compiled-core/<key>``, where the key hashes
every ``mlops_gpu`` source file, the mypy version and the Python version: any edit builds
again (about a minute on two cores), nothing stale is ever imported. It needs mypy (a test
dependency) and a C compiler with the Python headers.

Invariants: a cache directory exists only complete (built aside, then renamed into place);
the compiled modules are exactly ``MODULES``; the package under it is a copy of this
checkout's ``mlops_gpu`` at the key's sources.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mlops_gpu"
#: Compiled together, so that calls between them are native.
MODULES = ("core", "model")
#: mypyc type-checks what it compiles; the rest of the package (and mlflow, prefect, ...) is
#: not followed: their types are Any here (the full check is ``mypy --strict`` in the tests).
MYPY_INI = "[mypy]\nfollow_imports = skip\nignore_missing_imports = True\n"
#: Builds kept in the cache (the newest).
KEEP = 3


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlops-gpu" / "compiled-core"


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
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=out.parent))
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
        try:
            work.rename(out)
        except OSError:  # built meanwhile by another process: theirs is as good
            if not (out / "mlops_gpu").is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    builds = sorted((d for d in out.parent.iterdir() if not d.name.startswith("build-")),
                    key=lambda d: d.stat().st_mtime)  # fmt: skip
    for old in builds[:-KEEP]:  # (about 8 MB each; every edit of the package makes one)
        shutil.rmtree(old, ignore_errors=True)
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
