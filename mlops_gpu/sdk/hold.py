"""The job of a GPU lease (``mg.gpus``): waits while the holder process lives; SIGTERM (a
cancel) ends it at once. ``python -m mlops_gpu.sdk.hold PID``."""

from __future__ import annotations

import os
import signal
import sys
import time


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    holder = int(argv[0])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while alive(holder):
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
