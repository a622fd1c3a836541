#!/usr/bin/env bash
# The whole test suite, as README.md and CI run it: install (into .venv), start the real
# services the tests need (PostgreSQL and a 4-node Slurm cluster from Debian's packages, a
# Kubernetes control plane with 100 kwok GPU nodes built from Go modules; they stay up for the
# next run, `scripts/*.sh stop` ends them), lint, type-check (Python, and the native engine's
# two Rust crates with cargo where cargo is installed, and their unit tests: cargo test), then
# pytest. The install builds the Rust engine (mlops_gpu._engine) where cargo is on PATH.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"  # rustup's cargo, for the native engine (native/)
# Cargo's build directory under ~/.cache: the install's release build (and clippy's) is reused
# by the next run and by other checkouts, so an unchanged engine costs seconds, not minutes.
# PYO3_PYTHON fixed to this venv's Python (setuptools-rust would otherwise name pip's temporary
# build environment, which changes every install and makes cargo rebuild PyO3).
export CARGO_TARGET_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/mlops-gpu/native-target"
export PYO3_PYTHON="$PWD/.venv/bin/python"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Fast when everything is already installed; pip's cache lives in ~/.cache/pip.
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[test]"

echo "== starting PostgreSQL (scripts/postgres.sh)" >&2
if pg_url=$(bash scripts/postgres.sh start); then
  export MLOPS_GPU_TEST_PG_URL="$pg_url"
else
  echo "scripts/postgres.sh failed: PostgreSQL tests will skip (CI makes them fail)" >&2
fi

echo "== starting the local Slurm cluster (scripts/slurm.sh)" >&2
if slurm_env=$(bash scripts/slurm.sh start); then
  export "${slurm_env##*$'\n'}"  # SLURM_CONF=...
else
  echo "scripts/slurm.sh failed: Slurm tests will skip (CI makes them fail)" >&2
fi

echo "== starting the local Kubernetes control plane (scripts/k8s.sh; built from Go modules once)" >&2
if k8s_env=$(bash scripts/k8s.sh start); then
  export "${k8s_env##*$'\n'}"  # KUBECONFIG=...
else
  echo "scripts/k8s.sh failed: Kubernetes tests will skip (CI makes them fail)" >&2
fi

echo "== ruff" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict (mlops_gpu, plugins)" >&2
.venv/bin/mypy
if command -v cargo >/dev/null; then
  echo "== cargo fmt --check, cargo clippy, cargo test (native/ and native/py)" >&2
  (cd native && cargo fmt --all --check &&
    cargo clippy --workspace --release --locked -q -- -D warnings &&
    cargo test --workspace --locked -q)
else
  echo "cargo not found: the install built no Rust engine; its tests will skip (CI makes them fail)" >&2
fi
echo "== pytest" >&2
exec .venv/bin/python -m pytest "$@"
