"""Runs a function in a child process that sees exactly a lease's devices.

``CUDA_VISIBLE_DEVICES`` is one per process (and CUDA reads it once, when it starts), so
threads of one process cannot each see their own devices. ``GpuLease.call(fn, ...)`` (and so
``@gpu_task``) runs ``fn`` in a fresh Python process whose ``CUDA_VISIBLE_DEVICES`` and
``MLOPS_GPU_LEASE_DEVICES`` are the lease's devices: concurrent tasks in threads each get
their own, exactly. ``python -m mlops_gpu.sdk.isolated PATH.pkl`` is the child's side.

The function, its arguments, its value and its exception travel with cloudpickle: the child
gets the caller's ``sys.path``; a function of a module the child cannot import by name (a
flow file Prefect loaded under a generated name) is sent by value.

Invariants: the caller's environment is never modified; the function's exception is raised
again in the caller (as a ``RuntimeError`` with the child's traceback when it cannot be
pickled); a child that dies without a result raises ``ChildDied``.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


class ChildDied(RuntimeError):
    """The child process ended without returning or raising (killed, or out of memory)."""


def _send_module_by_value(fn: Callable[..., Any]) -> None:
    import cloudpickle

    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name or "")
    if module is None or name == "__main__":  # __main__ goes by value anyway
        return
    try:
        importable = importlib.util.find_spec(name or "") is not None
    except (ImportError, ValueError):
        importable = False
    if not importable:
        cloudpickle.register_pickle_by_value(module)


def call_in_child(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    devices: Sequence[str],
) -> Any:
    """``fn(*args, **kwargs)`` in a child process that sees exactly ``devices``."""
    import cloudpickle

    _send_module_by_value(fn)
    visible = ",".join(devices)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "MLOPS_GPU_LEASE_DEVICES": visible}
    with tempfile.TemporaryDirectory(prefix="mlops-gpu-call-") as d:
        path = Path(d) / "call.pkl"
        payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
        path.write_bytes(cloudpickle.dumps((list(sys.path), payload)))
        proc = subprocess.run([sys.executable, "-m", "mlops_gpu.sdk.isolated", str(path)], env=env)
        out = path.with_suffix(".out")
        if not out.exists():
            raise ChildDied(f"the child process running {getattr(fn, '__qualname__', fn)!r} "
                            f"exited with {proc.returncode} without a result")  # fmt: skip
        ok, value = pickle.loads(out.read_bytes())
    if ok:
        return value
    raise value


def main(path: str) -> int:
    import cloudpickle

    p = Path(path)
    submitter_path, payload = pickle.loads(p.read_bytes())
    sys.path.extend(x for x in submitter_path if x not in sys.path)
    fn, args, kwargs = pickle.loads(payload)
    try:
        result = (True, fn(*args, **kwargs))
        data = cloudpickle.dumps(result)
    except BaseException as e:  # every exception goes back to the caller
        try:
            data = cloudpickle.dumps((False, e))
            pickle.loads(data)  # an exception that pickles but cannot load is no use
        except Exception:
            text = "".join(traceback.format_exception(e))
            data = cloudpickle.dumps((False, RuntimeError(f"in the child process:\n{text}")))
    tmp = p.with_suffix(".out.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, p.with_suffix(".out"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
