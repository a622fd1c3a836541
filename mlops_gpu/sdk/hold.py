"""The job of a GPU lease (``mg.gpus``): waits while the holder process lives.
``python -m mlops_gpu.sdk.hold PID [RELEASE_FILE]``.

The holder ends the lease by writing its outcome (``succeeded`` or ``failed``) to
``RELEASE_FILE``: the job then exits 0 or 1, so the lease is recorded as the block ended (not
as a cancel). SIGTERM (a cancel) ends it at once; a holder that dies without releasing ends it
with 0 (the job cannot tell a crash from an exit that skipped the release).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

#: How often the job looks at its holder and release file (the lease's release latency).
POLL_S = 0.1


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def released(path: Path | None) -> int | None:
    """The exit code the holder asked for, or None while it has not released the lease."""
    if path is None:
        return None
    try:
        outcome = path.read_text().strip()
    except FileNotFoundError:
        return None
    if not outcome:  # written but not yet flushed: look again
        return None
    return 0 if outcome == "succeeded" else 1


def main(argv: list[str]) -> int:
    holder = int(argv[0])
    release = Path(argv[1]) if len(argv) > 1 else None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while alive(holder):
        code = released(release)
        if code is not None:
            return code
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
