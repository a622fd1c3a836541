"""Where the scripts that build the scheduling core (``compiled_core.py``, ``native_core.py``)
keep their builds: ``~/.cache/mlops-gpu/<kind>/<key of the sources>``.

Invariant: a build directory exists only complete. It is made aside (``workdir``), then renamed
into place (``publish``); where another process published the same key meanwhile, theirs is
kept. ``prune`` keeps the newest few builds of a kind: each edit of the sources makes one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlops-gpu"


def workdir(out: Path) -> Path:
    """A fresh directory beside ``out`` to build in."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="build-", dir=out.parent))


def publish(work: Path, out: Path, done: Path) -> None:
    """Rename the finished ``work`` to ``out`` (``done``: a path inside ``out`` that exists once
    a build is complete), then prune the older builds beside it."""
    try:
        work.rename(out)
    except OSError:  # built meanwhile by another process: theirs is as good
        if not done.exists():
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    prune(out.parent)


def prune(parent: Path, keep: int = 3) -> None:
    builds = sorted((d for d in parent.iterdir() if not d.name.startswith("build-")),
                    key=lambda d: d.stat().st_mtime)  # fmt: skip
    for old in builds[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
