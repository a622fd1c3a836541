"""``mlops-gpu logs``: a run's stdout then stderr, optionally followed until it ends.

The logs themselves are the run's own output, written out as they are (as ``cat`` would); what
this module says about the run (its reason) is shown literally (``safe_text.visible``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from mlops_gpu.cli.safe_text import visible
from mlops_gpu.model import TERMINAL_PHASES, Run


def _files(rt: Any, run: Run, attempt: int) -> list[Path]:
    from mlops_gpu.controller.views import log_files

    return log_files(rt, run, attempt)


def print_logs(rt: Any, run: Run, attempt: int | None, follow: bool) -> int:
    attempt = attempt or run.attempt
    if not follow:
        files = _files(rt, run, attempt)
        if not files:
            why = f"{run.phase.value}" + (f": {visible(run.reason, 500)}" if run.reason else "")
            print(
                f"mlops-gpu: run {run.id} attempt {attempt} has no logs yet ({why})",
                file=sys.stderr,
            )
            return 0 if run.phase.value == "pending" else 1
        for f in files:
            data = f.read_bytes()
            if f.name == "stderr.log" and data:
                sys.stdout.flush()
                sys.stdout.write("--- stderr ---\n")
            sys.stdout.write(data.decode(errors="replace"))
        return 0
    offsets: dict[Path, int] = {}
    while True:
        current = rt.store.get(run.id)
        for f in _files(rt, run, attempt):
            if f.name != "stdout.log":
                continue
            with open(f, "rb") as fh:
                fh.seek(offsets.get(f, 0))
                chunk = fh.read()
                offsets[f] = fh.tell()
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        if current is None or current.phase in TERMINAL_PHASES or current.attempt != attempt:
            break
        time.sleep(0.5)
    for f in _files(rt, run, attempt):
        if f.name == "stderr.log" and f.stat().st_size:
            sys.stdout.write("--- stderr ---\n" + f.read_text(errors="replace"))
    return 0
