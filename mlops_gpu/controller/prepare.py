"""What a submit checks on disk before it stores a run, so that it is atomic.

A submit writes the run's row last: before it, every folder the run will need on this host is
created and proven writable (a file is made and removed in each), and the background scheduler,
when asked for, is started. Whatever of this fails raises a one-line ``SetupError`` with no run
stored, so a retry after the fix makes exactly one run.

Folders by backend (each backend model's ``host_folders``): ``local`` writes each attempt's
logs under ``<state_dir>/runs`` and its checkpoints under ``<state_dir>/checkpoints``; ``slurm``
its job scripts and logs under its shared folder; every backend's scheduler logs to
``<state_dir>/scheduler.log``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mlops_gpu.config import Config
from mlops_gpu.model import RunSpec
from mlops_gpu.state import SetupError


def run_folders(cfg: Config, specs: Iterable[RunSpec]) -> list[Path]:
    """The folders on this host the runs ``specs`` may write to (the state folder first)."""
    names = {s.backend for s in specs}
    chosen = list(cfg.backends) if None in names else [n for n in cfg.backends if n in names]
    out = [cfg.state_path]
    for name in chosen:
        out += cfg.backends[name].host_folders(cfg, name)
    return list(dict.fromkeys(out))


def prepare_folders(cfg: Config, specs: Iterable[RunSpec]) -> None:
    """Create the runs' folders and prove each writable; ``SetupError`` names the first that
    is not."""
    for folder in run_folders(cfg, specs):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=folder)
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(probe)
        except OSError as e:
            raise SetupError(unwritable(cfg, folder, e)) from None


def unwritable(cfg: Config, folder: Path, e: OSError) -> str:
    """The one line for a folder of the state that cannot be written."""
    where = str(e.filename or folder)
    why = e.strerror if where == str(folder) else f"{e.strerror}; needed for {folder}"
    setting = f"set state_dir: in {cfg.source}" if cfg.source else "set state_dir: elsewhere"
    return (
        f"{where} cannot be written ({why}): "
        f"make it a folder writable by this user, or {setting}; no run was stored"
    )
