"""Where a Python callable submitted as a run is kept: for its job (``python -m
mlops_gpu.sdk.call PATH``) and for ``Run.result()``, in local mode (the SDK writes it) and in
remote mode (the server writes what the request carried).

Invariants:
- A callable is one file ``STATE/calls/<32 hex>.pkl`` holding ``pickle((import_path,
  payload))``, ``payload`` being the cloudpickle of ``(fn, args, kwargs)``; the job writes its
  value beside it as ``<same>.result``. Whoever writes the file never unpickles the payload.
- ``call_file`` accepts only a command of exactly that form whose file lies in that folder: a
  command naming another path has no result to read (a request cannot point it elsewhere).
"""

from __future__ import annotations

import pickle
import uuid
from pathlib import Path
from typing import Any

from mlops_gpu.controller.prepare import unwritable
from mlops_gpu.state import SetupError

CALL_MODULE = "mlops_gpu.sdk.call"


def calls_dir(cfg: Any) -> Path:
    return Path(cfg.state_path) / "calls"


def call_command(python: str, path: Path) -> tuple[str, ...]:
    return (python, "-m", CALL_MODULE, str(path))


def write_call(cfg: Any, payload: bytes, import_path: list[str]) -> Path:
    """The file of a new callable (``SetupError``, one line, when the folder is unwritable)."""
    folder = calls_dir(cfg)
    path = folder / f"{uuid.uuid4().hex}.pkl"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps((import_path, payload)))
    except OSError as e:
        raise SetupError(unwritable(cfg, folder, e)) from None
    return path


def call_file(cfg: Any, command: tuple[str, ...]) -> Path | None:
    """The callable's file of a run's command, or None when the command is not one."""
    if len(command) != 4 or command[1:3] != ("-m", CALL_MODULE):
        return None
    path = Path(command[3])
    if path.suffix != ".pkl" or path.parent.resolve() != calls_dir(cfg).resolve():
        return None
    return path
