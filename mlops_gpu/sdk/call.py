"""Runs a pickled callable inside a job: ``python -m mlops_gpu.sdk.call PATH.pkl``; writes
its return value to ``PATH.result`` (atomically) for ``Run.result()``."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path


def main(path: str) -> int:
    p = Path(path)
    fn, args, kwargs = pickle.loads(p.read_bytes())
    value = fn(*args, **kwargs)
    tmp = p.with_suffix(".result.tmp")
    tmp.write_bytes(pickle.dumps(value))
    os.replace(tmp, p.with_suffix(".result"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
