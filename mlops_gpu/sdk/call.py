"""Runs a pickled callable inside a job: ``python -m mlops_gpu.sdk.call PATH.pkl``; writes
its return value to ``PATH.result`` (atomically) for ``Run.result()``."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path


def main(path: str) -> int:
    p = Path(path)
    submitter_path, payload = pickle.loads(p.read_bytes())
    sys.path.extend(x for x in submitter_path if x not in sys.path)
    fn, args, kwargs = pickle.loads(payload)
    value = fn(*args, **kwargs)
    tmp = p.with_suffix(".result.tmp")
    tmp.write_bytes(pickle.dumps(value))
    os.replace(tmp, p.with_suffix(".result"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
