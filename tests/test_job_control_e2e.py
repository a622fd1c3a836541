"""Job control end to end on the local backend (real processes): runs submitted with the CLI
as a user would, the scheduler's loop ticking in this process. A 100-element array with %8
(never more than 8 running, all 100 succeed, each sees its index), a 3-stage ``--afterok``
pipeline whose stage 2 fails (stage 3 ends cancelled with the reason), hold and release, and
bad input refused with one line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import run_cli

from mlops_gpu.config import load_config
from mlops_gpu.controller import Controller, Runtime
from mlops_gpu.model import ACTIVE_PHASES, TERMINAL_PHASES, Phase
from mlops_gpu.testing import config_yaml


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    extra = {"telemetry": {"launcher": False}, "mlflow": {"enabled": False}}
    p = tmp_path / "mlops-gpu.yaml"
    p.write_text(config_yaml(nodes=[("node-a", 16)], projects={"p": (16, 0)}, extra=extra))
    return p


def cli(cfg: Path, *args: str) -> str:
    r = run_cli("--config", str(cfg), *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def submit(cfg: Path, *args: str) -> str:
    return cli(cfg, "submit", "--no-start", "-p", "p", *args)


def runtime(cfg: Path) -> Runtime:
    return Runtime(load_config(str(cfg)))


def tick_until(rt: Runtime, ids: list[str], timeout: float = 120, each: object = None) -> None:
    ctl = Controller(rt)
    deadline = time.time() + timeout
    while True:
        ctl.tick()
        if callable(each):
            each()
        runs = [rt.store.get(i) for i in ids]
        if all(r is not None and r.phase in TERMINAL_PHASES for r in runs):
            return
        assert time.time() < deadline, [(r.id, r.phase) for r in runs if r is not None]
        time.sleep(0.05)


def test_array_of_100_with_limit_8(cfg: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    aid = submit(cfg, "--array", "0-99%8", "--", "sh", "-c",
                 f"echo $MLOPS_GPU_ARRAY_INDEX > {out}/$MLOPS_GPU_ARRAY_INDEX")  # fmt: skip
    rt = runtime(cfg)
    ids = [f"{aid}_{i}" for i in range(100)]
    assert [r.id for r in rt.store.list_runs() if r.spec.array_id == aid] == ids
    folded = cli(cfg, "queue")
    assert aid in folded and "100 elements" in folded and f"{aid}_7" not in folded
    assert f"{aid}_7" in cli(cfg, "queue", "--expand")
    most = [0]

    def count() -> None:
        running = [r for r in rt.store.list_runs(ACTIVE_PHASES) if r.spec.array_id == aid]
        most[0] = max(most[0], len(running))
        assert len(running) <= 8

    tick_until(rt, ids, timeout=300, each=count)
    runs = [rt.store.get(i) for i in ids]
    assert all(r is not None and r.phase is Phase.SUCCEEDED for r in runs)
    assert most[0] == 8  # the limit, reached (16 GPUs would allow more)
    assert sorted(int(p.read_text()) for p in out.iterdir()) == list(range(100))
    waited = {r.reason_code for i in ids for r in [rt.store.get(i)] if r is not None}
    assert waited <= {None}  # reasons are cleared once they run


def test_afterok_pipeline_stage_2_fails_stage_3_cancelled(cfg: Path) -> None:
    s1 = submit(cfg, "--name", "stage1", "--", "true")
    s2 = submit(cfg, "--afterok", s1, "--name", "stage2", "--", "sh", "-c", "exit 3")
    s3 = submit(cfg, "--afterok", s2, "--name", "stage3", "--", "true")
    rt = runtime(cfg)
    Controller(rt).tick()
    q = {r["id"]: r for r in json.loads(cli(cfg, "queue", "--json"))}
    assert q[s3]["reason_code"] == "dependency" and s2 in q[s3]["reason"]
    tick_until(rt, [s1, s2, s3])
    r1, r2, r3 = (rt.store.get(i) for i in (s1, s2, s3))
    assert r1 is not None and r1.phase is Phase.SUCCEEDED
    assert r2 is not None and r2.phase is Phase.FAILED and r2.started_at is not None
    assert r3 is not None and r3.phase is Phase.CANCELLED and r3.started_at is None
    assert r3.reason_code == "dependency"
    assert f"run {s2} failed (afterok needs it to succeed)" in (r3.reason or "")
    st = json.loads(cli(cfg, "status", s3, "--json"))[0]
    assert st["phase"] == "cancelled" and st["reason_code"] == "dependency"


def test_hold_and_release(cfg: Path) -> None:
    rid = submit(cfg, "--hold", "--", "true")
    rt = runtime(cfg)
    ctl = Controller(rt)
    for _ in range(3):
        ctl.tick()
    run = rt.store.get(rid)
    assert run is not None and run.phase is Phase.PENDING and run.reason_code == "held"
    assert cli(cfg, "release", rid) == f"{rid}: released"
    assert cli(cfg, "release", rid) == f"{rid}: already released"
    tick_until(rt, [rid])
    kinds = [e.kind for e in rt.store.events(rid)]
    assert kinds[:2] == ["submitted", "released"] and "admitted" in kinds
    other = submit(cfg, "--begin", "now+1h", "--", "true")
    assert cli(cfg, "hold", other) == f"{other}: held"
    done = rt.store.get(rid)
    assert done is not None
    assert cli(cfg, "hold", rid).startswith(f"{rid}: not held: it is succeeded")


def test_begin_time_waits_with_its_eta(cfg: Path) -> None:
    rid = submit(cfg, "--begin", "now+2h", "--", "true")
    rt = runtime(cfg)
    Controller(rt).tick()
    q = json.loads(cli(cfg, "queue", "--json"))[0]
    assert q["id"] == rid and q["reason_code"] == "begin_time" and q["eta"] is not None
    run = rt.store.get(rid)
    assert run is not None and run.eta is not None and run.eta == run.spec.begin_at
    assert abs(run.eta - (run.submitted_at + 7200)) < 60


@pytest.mark.parametrize(
    "args,words",
    [
        (["--array", "5-1"], "--array '5-1': range 5-1 ends before it starts"),
        (["--array", "0-1000000"], "more than max_array_size (10000) elements"),
        (["--array", "0-3%0"], "%N must be a positive integer"),
        (["--afterok", "rdeadbeef00"], "dependency on unknown run id 'rdeadbeef00'"),
        (["--after", ","], "--after: expected run ids separated by commas"),
        (["--begin", "tomorrow"], "--begin: expected now, now+DURATION"),
    ],
    ids=["reversed-range", "too-big", "zero-limit", "unknown-id", "empty-id", "bad-begin"],
)
def test_bad_input_is_one_line(cfg: Path, args: list[str], words: str) -> None:
    r = run_cli("--config", str(cfg), "submit", "--no-start", "-p", "p", *args, "--", "true")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert runtime(cfg).store.count() == 0


def test_cancel_an_array_cancels_every_element(cfg: Path) -> None:
    aid = submit(cfg, "--array", "1,3,5", "--hold", "--", "true")
    out = cli(cfg, "cancel", aid)
    assert out.splitlines() == [f"{aid}_{i}: cancelled" for i in (1, 3, 5)]
    st = json.loads(cli(cfg, "status", aid, "--json"))
    assert [r["phase"] for r in st] == ["cancelled"] * 3
    r = run_cli("--config", str(cfg), "hold", "rnosuchrun0")
    assert r.returncode == 2 and "no run with id 'rnosuchrun0'" in r.stderr
