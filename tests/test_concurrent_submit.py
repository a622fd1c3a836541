"""Acceptance: 8 processes submitting 1,000 runs each into one store at once lose nothing.

Each worker is a fresh interpreter (``python -c``) that opens its own ``Store(url)`` (the store is
new, so the workers also race to create its schema), reports ready, waits for a shared start file
and then submits ``w{worker}-{i}`` for i in 0..999, writing the ids it got back to a file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from mlops_gpu.state import Store

WORKERS = 8
PER_WORKER = 1000

WORKER = """
import os, sys, time
from pathlib import Path
from mlops_gpu.state import Store
from mlops_gpu.testing.builders import make_spec

url, worker, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
store = Store(url)
(d / f"ready-{worker}").touch()
deadline = time.monotonic() + 120
while not (d / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.005)
t0 = time.monotonic()
ids = [store.submit(make_spec(f"proj{worker % 3}", name=f"w{worker}-{i}")).id for i in range(n)]
elapsed = time.monotonic() - t0
store.close()
tmp = d / f"ids-{worker}.tmp"
tmp.write_text("\\n".join(ids))
os.replace(tmp, d / f"ids-{worker}")
print(f"worker {worker}: {n} submits in {elapsed:.2f}s", flush=True)
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/concurrent.db"
    return str(request.getfixturevalue("pg_store_url"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eight_processes_submit_a_thousand_runs_each(store_url: str, tmp_path: Path) -> None:
    d = tmp_path / "sync"
    d.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, store_url, str(w), str(PER_WORKER), str(d)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for w in range(WORKERS)
    ]
    try:
        deadline = time.monotonic() + 120
        while len(list(d.glob("ready-*"))) < WORKERS:
            dead = [p for p in procs if p.poll() not in (None, 0)]
            assert not dead, dead[0].communicate()[0]
            assert time.monotonic() < deadline, "workers did not open the store in time"
            time.sleep(0.01)
        t0 = time.monotonic()
        (d / "go").touch()
        outputs = [p.communicate(timeout=840)[0] for p in procs]
        wall = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
    backend = "sqlite" if store_url.startswith("sqlite") else "postgres"
    total = WORKERS * PER_WORKER
    print(
        f"\n{backend}: {total} submits by {WORKERS} processes in {wall:.2f}s wall "
        f"({total / wall:.0f}/s)"
    )
    print("".join(outputs), end="")

    reported = {w: (d / f"ids-{w}").read_text().split("\n") for w in range(WORKERS)}
    store = Store(store_url)
    try:
        assert store.count() == total
        runs = store.list_runs()
        events = store.events()
    finally:
        store.close()

    # every (worker, i) stored exactly once, under the id its worker was given
    names = Counter(r.spec.name for r in runs)
    expected = {f"w{w}-{i}" for w in range(WORKERS) for i in range(PER_WORKER)}
    assert set(names) == expected and set(names.values()) == {1}
    by_name = {r.spec.name: r for r in runs}
    for w, ids in reported.items():
        assert ids == [by_name[f"w{w}-{i}"].id for i in range(PER_WORKER)]
        seqs = [by_name[f"w{w}-{i}"].seq for i in range(PER_WORKER)]
        assert seqs == sorted(seqs)  # one worker's submits are ordered by seq
    ids = [r.id for r in runs]
    assert len(set(ids)) == total
    assert len({r.seq for r in runs}) == total
    assert all(r.phase == "pending" and r.attempt == 1 for r in runs)
    assert all(r.spec.project == f"proj{int(r.spec.name.split('-')[0][1:]) % 3}" for r in runs)

    # one submitted event per run, nothing else
    assert len(events) == total
    assert {e.kind for e in events} == {"submitted"}
    assert Counter(e.run_id for e in events) == Counter(ids)
