"""Issue 23, item 1, replayed on real processes through the CLI: ``mlops-gpu init --virtual-gpus
8``, two 4-GPU runs A and B without ``--max-runtime`` running, then a 2-GPU run C, an 8-GPU run D
with ``--max-runtime 600`` and a 1-GPU run E with ``--priority high``, in a clean HOME.

What must hold (checked from what users see: ``status --events --json``, and the supervisor's
records of every attempt: ``launch.json`` for its devices, ``exit.json`` for when it ran):
- no device is used by two attempts that run at the same time;
- no wasted preemption: each preempting event names its preemptor, which was admitted before the
  victim exited (the same decision) and started on devices the victim freed right after it
  exited, no other run on its devices in between;
- A, B and C (no checkpoint) are never preempted by a run of their own class;
- D starts once A and B (the attempts running when it came) have ended, and every run
  succeeds.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

pytestmark = pytest.mark.slow

#: A job: print its devices, then work for ``argv[1]`` seconds (no checkpoint).
WORK = "import os,sys,time; print(os.environ['CUDA_VISIBLE_DEVICES'], flush=True); " \
       "time.sleep(float(sys.argv[1]))"  # fmt: skip


def _cli(home: Path, *args: str) -> str:
    env = {"HOME": str(home), "MLOPS_GPU_CONFIG": "", "MLFLOW_TRACKING_URI": ""}
    r = run_cli(*args, cwd=home / "work", env=env, timeout=90)
    assert r.returncode == 0, f"mlops-gpu {' '.join(args)}: {r.stderr[-2000:]}"
    return r.stdout


def _submit(home: Path, name: str, gpus: int, work_s: float, *extra: str) -> str:
    return _cli(home, "submit", "-p", "default", "-g", str(gpus), "-n", name, *extra, "--",
                sys.executable, "-c", WORK, str(work_s)).strip()  # fmt: skip


def _status(home: Path, *ids: str, events: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = json.loads(
        _cli(home, "status", *ids, "--json", *(["--events"] if events else []))
    )
    return out


def _attempts(state: Path, run_id: str) -> list[dict[str, Any]]:
    """Each attempt the supervisor ran: devices, start and end (the runner's own clock)."""
    out = []
    for d in sorted((state / "runs" / run_id).iterdir(), key=lambda p: int(p.name)):
        launch = json.loads((d / "launch.json").read_text())
        ended = json.loads((d / "exit.json").read_text())
        out.append({"run": run_id, "attempt": int(d.name), "devices": set(launch["devices"]),
                    "start": ended["started_at"], "end": ended["finished_at"]})  # fmt: skip
    return out


def test_issue_steps_replayed_without_wasted_or_same_class_preemptions(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    _cli(home, "init", "--virtual-gpus", "8", "--force")
    state = home / "work" / "state"
    a = _submit(home, "A", 4, 6)
    b = _submit(home, "B", 4, 6)
    deadline = time.time() + 30
    while {r["phase"] for r in _status(home, a, b)} != {"running"}:
        assert time.time() < deadline, _status(home, a, b)
        time.sleep(0.2)
    c = _submit(home, "C", 2, 2)
    d = _submit(home, "D", 8, 2, "--max-runtime", "600")
    e = _submit(home, "E", 1, 2, "--priority", "high")
    ids = {"A": a, "B": b, "C": c, "D": d, "E": e}
    names = {v: k for k, v in ids.items()}
    deadline = time.time() + 45
    ended = ("succeeded", "failed", "cancelled")
    while any(r["phase"] not in ended for r in _status(home, *ids.values())):
        assert time.time() < deadline, _status(home, *ids.values())
        time.sleep(0.3)
    runs = {names[r["id"]]: r for r in _status(home, *ids.values(), events=True)}
    assert {k: r["phase"] for k, r in runs.items()} == dict.fromkeys(ids, "succeeded")
    attempts = [x for rid in ids.values() for x in _attempts(state, rid)]

    # no device used by two attempts at once
    for i, x in enumerate(attempts):
        for y in attempts[i + 1 :]:
            if x["start"] < y["end"] and y["start"] < x["end"]:
                assert not x["devices"] & y["devices"], (x, y)

    by_key = {(x["run"], x["attempt"]): x for x in attempts}
    preemptions = []
    for name, r in runs.items():
        for ev in r["events"]:
            if ev["kind"] != "preempting":
                continue
            m = re.search(r"for run (r[0-9a-f]+)", ev["reason"])
            assert m, ev  # one project: every preemption names its preemptor
            preemptions.append((name, ev, names[m.group(1)]))
    summary = [(v, p, ev.get("lost_gpu_s")) for v, ev, p in preemptions]
    print("preemptions (victim, preemptor, lost GPU-s):", summary)
    for victim, ev, by in preemptions:
        gone = by_key[(ids[victim], ev["attempt"])]
        # the preemptor was admitted before the victim exited (the same decision) ...
        adm = [x for x in runs[by]["events"] if x["phase_to"] == "admitted"]
        t = iso_s(ev["time"])
        assert any(t <= iso_s(x["time"]) <= gone["end"] for x in adm), (victim, by, adm)
        # ... and its next attempt started on devices the victim freed, soon after it exited,
        # nobody else on its devices in between (held for it)
        nxt = min((x for x in attempts if x["run"] == ids[by] and x["start"] >= gone["end"]),
                  key=lambda x: x["start"])  # fmt: skip
        assert nxt["devices"] & gone["devices"], (victim, by, gone, nxt)
        assert nxt["start"] - gone["end"] < 5, (victim, by, gone, nxt)
        for x in attempts:
            if x is not nxt and x["devices"] & nxt["devices"]:
                assert not t <= x["start"] < nxt["start"], (victim, by, x)
        # the lost work is shown: the victim ran without a checkpoint since its start
        assert ev["lost_gpu_s"] is not None and ev["lost_gpu_s"] > 0
        # A, B, C (no checkpoint) are never taken by a run of their own class
        assert runs[by]["priority"] != runs[victim]["priority"], (victim, by)
    # D (never a preemptor of A or B, checked above) starts once the A and B that ran when it
    # came have ended (one may have been preempted by E; its retry may come before or after D)
    last_ab = max(x["end"] for x in attempts if x["run"] in (a, b) and x["attempt"] == 1)
    d_start = min(x["start"] for x in attempts if x["run"] == d)
    print(f"D started {d_start - last_ab:.1f} s after A and B ended")
    assert d_start >= last_ab


def iso_s(text: str) -> float:
    """Seconds since the epoch of the CLI's ISO time (``model.public.iso``)."""
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
