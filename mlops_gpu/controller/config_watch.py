"""Live config: the running scheduler follows its config file.

``ConfigWatch.check`` is called between ticks. It stats the file (size, mtime, inode) and
re-reads it only when that changed, or when asked to (``request``: SIGHUP; an edit that keeps
size, mtime and inode is seen only then). A changed file is validated in full before anything
is applied:

- a file that does not load (bad YAML, an unknown key, a bad value, a missing file) is refused:
  the scheduler keeps the config it runs and logs ONE line, the ``ConfigError`` (file, key path,
  problem), once per refused version of the file (its content hash), not every tick;
- a file that loads is applied at the next tick (``apply``): projects, quotas, cohorts, GPU
  types and prices, priority classes, the default class, policy and retry. The Mirror compares
  the engine's template each tick and rebuilds the engine (native or Python) around the same
  runs when these change, so pending runs are re-evaluated: a run that waited as ``invalid``
  for a project the edit adds is queued, one blocked by a quota the edit raises may start;
- ``RESTART_KEYS`` (store, state dir, backends, MLflow, telemetry, scheduler timings) hold
  open connections, processes and threads: they keep their loaded values until the scheduler
  restarts (``mlops-gpu scheduler restart``), which one line says when an edit changes them.

Invariant: ``current`` is always a config that validated, merged from the file's latest valid
version and the restart-only sections the scheduler started with; ``version`` names the file
content it came from (sha256) and that file's mtime.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from mlops_gpu.config import Config, ConfigError, load_config

if TYPE_CHECKING:
    from mlops_gpu.controller.loop import Controller

log = logging.getLogger("mlops_gpu.config")

#: Sections applied only when the scheduler restarts (they hold connections and processes).
RESTART_KEYS = ("store", "state_dir", "backends", "mlflow", "telemetry", "scheduler")


@dataclass(frozen=True)
class FileVersion:
    sha256: str
    mtime: float


def stat_signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def file_version(path: Path) -> FileVersion | None:
    """The content hash and mtime of ``path`` now (None: it cannot be read)."""
    sig, digest = stat_signature(path), _digest(path)
    if sig is None or digest is None:
        return None
    return FileVersion(digest, sig[0] / 1e9)


class ConfigWatch:
    def __init__(self, cfg: Config) -> None:
        assert cfg.source is not None, "a config from a file"
        self.path = Path(cfg.source).resolve()
        self.current = cfg
        self._sig = stat_signature(self.path)
        v = file_version(self.path)
        self.version: FileVersion | None = v
        #: the last refusal (one line), until a version loads
        self.error: str | None = None
        #: restart-only sections the file changed since the scheduler started
        self.restart_needed: tuple[str, ...] = ()
        self._refused: set[str] = set()
        self._forced = False

    def request(self) -> None:
        """Re-read the file at the next check whatever its stat says (SIGHUP; signal-safe)."""
        self._forced = True

    def check(self) -> Config | None:
        """The new config to apply, or None (unchanged, or refused: the old one stays)."""
        forced, self._forced = self._forced, False
        sig = stat_signature(self.path)
        if sig == self._sig and not forced:
            return None
        self._sig = sig
        if sig is None:
            self._refuse("missing", f"{self.path}: no such file")
            return None
        digest = _digest(self.path)
        if digest is None:
            self._refuse("unreadable", f"{self.path}: cannot read the file")
            return None
        if self.version is not None and digest == self.version.sha256:
            # an edit undone: the loaded version is the file again (a later bad one is news)
            self.error = None
            self._refused.clear()
            return None
        if digest in self._refused:
            return None
        try:
            new = load_config(self.path)
        except ConfigError as e:
            self._refuse(digest, str(e))
            return None
        if _digest(self.path) != digest:  # written again while we read it: next check
            self._sig = None
            return None
        try:
            merged, later = merge(self.current, new)
        except ConfigError as e:
            self._refuse(digest, str(e))
            return None
        self.current, self.version, self.error = merged, FileVersion(digest, sig[0] / 1e9), None
        self._refused.clear()
        log.info("%s: config reloaded (sha256 %s)", self.path, digest[:12])
        if later and later != self.restart_needed:
            log.warning(
                "%s: %s changed: applied when the scheduler restarts (`mlops-gpu scheduler "
                "restart`); the other sections are applied now",
                self.path,
                ", ".join(later),
            )
        self.restart_needed = later
        return merged

    def _refuse(self, key: str, msg: str) -> None:
        self.error = msg
        if key in self._refused:
            return
        self._refused.add(key)
        # one line: the ConfigError is one line already (file, key path, problem)
        log.error("%s; the scheduler keeps running the config it loaded before", msg)


def merge(old: Config, new: Config) -> tuple[Config, tuple[str, ...]]:
    """``new`` with the restart-only sections of ``old``, checked as a whole (a GPU type the
    edit removes may still be named by a node of the running backends); and which of those
    sections the edit changed."""
    later = tuple(k for k in RESTART_KEYS if getattr(old, k) != getattr(new, k))
    if not later:
        return new, ()
    fields = {k: getattr(old if k in later else new, k) for k in Config.model_fields}
    try:  # (the sections are models already: only the cross-references are checked again)
        merged = Config.model_validate(fields)
    except ValidationError as e:
        why = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        raise ConfigError(
            f"{new.source}: {why} (with the {', '.join(later)} loaded before: they change "
            "at a restart)"
        ) from None
    return merged.bind(new.source, new.root), later


def apply(ctl: Controller, cfg: Config) -> None:
    """Make ``cfg`` the running config: the next tick's template is built from it (the Mirror
    rebuilds its engine when projects, classes, GPU types or policy differ), MLflow costs use
    its prices."""
    ctl.rt.cfg = cfg
    ctl.tracker.gpu_types = cfg.model_gpu_types()
