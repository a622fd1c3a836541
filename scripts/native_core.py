"""The native engine: ``native/`` (Rust, PyO3) built into the extension ``mlops_gpu_native``.

    python scripts/native_core.py build    # print the extension's path

The build is cached under ``~/.cache/mlops-gpu/native-core/<key>/``, where the key hashes every
file under ``native/`` (sources, Cargo.toml, Cargo.lock), the Rust compiler's version and the
Python version: any edit builds again (about half a minute on two cores; Cargo's own build
directory, ``~/.cache/mlops-gpu/native-target``, keeps the compiled dependencies), nothing stale
is ever loaded. It needs ``cargo`` (Rust 1.82 or later) and the crate registry, or the crates in
Cargo's cache.

Invariant: a cache directory exists only complete (``build_cache.publish``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import build_cache

REPO = Path(__file__).resolve().parents[1]
CRATE = REPO / "native"
NAME = "mlops_gpu_native"


def _rustc_version() -> str:
    try:
        out = subprocess.run(["rustc", "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"native_core: rustc not found or failing ({e}): install Rust") from e
    return out.stdout.strip()


def key() -> str:
    h = hashlib.sha256()
    h.update(f"{_rustc_version()}\n{sys.version}\n".encode())
    for path in sorted(CRATE.rglob("*")):
        if path.is_file() and "target" not in path.relative_to(CRATE).parts:
            h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(quiet: bool = True) -> Path:
    """The path of the built extension (built when missing)."""
    out = build_cache.cache_root() / "native-core" / key()
    ext = out / f"{NAME}.so"
    if ext.is_file():
        return ext
    cargo = shutil.which("cargo")
    if cargo is None:
        raise SystemExit("native_core: cargo not found: install Rust (rustup, or Debian's cargo)")
    target = build_cache.cache_root() / "native-target"
    env = {**os.environ, "CARGO_TARGET_DIR": str(target), "PYO3_PYTHON": sys.executable}
    print("native_core: building the native engine with cargo ...", file=sys.stderr)
    proc = subprocess.run([cargo, "build", "--release", "--locked"], cwd=CRATE, env=env,
                          capture_output=quiet, text=True)  # fmt: skip
    if proc.returncode != 0:
        tail = ((proc.stdout or "") + (proc.stderr or ""))[-4000:]
        raise SystemExit(f"native_core: cargo build failed (exit {proc.returncode}):\n{tail}")
    built = target / "release" / f"lib{NAME}.so"
    if not built.is_file():
        raise SystemExit(f"native_core: cargo built no {built}")
    work = build_cache.workdir(out)
    shutil.copy2(built, work / ext.name)
    build_cache.publish(work, out, ext)
    return ext


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    print(build(quiet=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
