"""The job supervisor the local backend starts for every run attempt (stdlib only, so that it
starts in tens of milliseconds).

``python -m mlops_gpu.backends.runner --dir DIR [--signal SIG] [--grace S] [--max-runtime S]
-- CMD...``

Invariants:
- The child runs in its own session (process group), with stdout/stderr in DIR/stdout.log and
  DIR/stderr.log.
- Stop protocol: SIGTERM to the supervisor (or the max runtime passing) sends the run's checkpoint
  signal to the child's whole group (with ``--leader-signal``, to the child alone: the
  ``mlops-gpu exec`` launcher passes it on to the group itself, so nobody gets it twice), then
  SIGKILL to the group after the grace. A ``stop.json``
  in DIR, written before the SIGTERM, may override signal and grace for that stop.
- When the child ends, ``exit.json`` is written atomically (tmp + rename) before the supervisor
  exits, so a scheduler that was down meanwhile still learns how the run ended.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _sig(name: str) -> int:
    return int(getattr(signal, name if name.startswith("SIG") else "SIG" + name))


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mlops_gpu.backends.runner")
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--signal", default="SIGTERM")
    ap.add_argument("--grace", type=float, default=30.0)
    ap.add_argument("--max-runtime", type=float, default=None)
    ap.add_argument("--leader-signal", action="store_true")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    d: Path = args.dir
    (d / "runner.pid").write_text(str(os.getpid()))

    stop: dict[str, object] = {}

    def on_stop(signum: int, _frame: object) -> None:
        stop.setdefault("requested", time.time())

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_stop)

    started = time.time()
    try:
        with open(d / "stdout.log", "ab") as out, open(d / "stderr.log", "ab") as err:
            child = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
            )
    except OSError as e:
        with open(d / "stderr.log", "a") as err_txt:
            err_txt.write(f"mlops-gpu: cannot start {cmd[:1]}: {e}\n")
        _write_json(
            d / "exit.json",
            {
                "exit_code": 127,
                "reason": "exec_failed",
                "message": str(e),
                "started_at": started,
                "finished_at": time.time(),
            },
        )
        return 127
    (d / "child.pid").write_text(str(child.pid))

    reason = "exited"
    kill_at: float | None = None
    while True:
        try:
            code = child.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.time()
        if kill_at is None:
            timed_out = args.max_runtime is not None and now - started >= args.max_runtime
            if "requested" in stop or timed_out:
                sig_name, grace = args.signal, args.grace
                stop_file = d / "stop.json"
                if stop_file.exists():
                    try:
                        o = json.loads(stop_file.read_text())
                        sig_name, grace = o.get("signal", sig_name), float(o.get("grace", grace))
                    except (ValueError, OSError):
                        pass
                reason = "stopped" if "requested" in stop else "max_runtime"
                if args.leader_signal:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, _sig(sig_name))
                else:
                    _killpg(child.pid, _sig(sig_name))
                kill_at = now + grace
        elif now >= kill_at:
            _killpg(child.pid, signal.SIGKILL)
            kill_at = float("inf")
    _write_json(
        d / "exit.json",
        {
            "exit_code": code,
            "reason": reason,
            "started_at": started,
            "finished_at": time.time(),
        },
    )
    return code if code >= 0 else 128 - code


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


if __name__ == "__main__":
    sys.exit(main())
