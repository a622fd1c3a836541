"""Job control over the API: arrays, dependencies, holds and begin times in ``POST /runs``;
``POST /runs/{id}/hold`` and ``/release`` with cancel's role rules; the remote CLI passing
them; one-line refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from conftest import run_cli

from team.conftest import Server, no_5xx

RUN = {"command": ["true"], "project": "p"}


def test_submit_with_job_control_and_hold_release_roles(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    srv = make_server(None, "--no-scheduler")
    with srv.client("mem") as c, srv.client("peer") as peer, srv.client("mara") as mara:
        arr = c.post("/api/v1/runs", json={**RUN, "array": "0-3%2", "hold": True}).json()
        aid = arr["array_id"]
        assert [r["id"] for r in arr["runs"]] == [f"{aid}_{i}" for i in range(4)]
        assert {r["reason_code"] for r in arr["runs"]} == {"held"}
        dep = c.post("/api/v1/runs", json={**RUN, "afterok": [aid], "begin": "now+1h"})
        assert dep.status_code == 201, dep.text
        # a member releases its own runs, not a peer's; a maintainer any run of the project
        assert peer.post(f"/api/v1/runs/{aid}/release").status_code == 403
        one = c.post(f"/api/v1/runs/{aid}_0/release").json()
        assert one["result"] == "released"
        rest = mara.post(f"/api/v1/runs/{aid}/release").json()
        assert rest["runs"] == {f"{aid}_0": "already released",
                                **{f"{aid}_{i}": "released" for i in (1, 2, 3)}}  # fmt: skip
        assert c.post(f"/api/v1/runs/{dep.json()['id']}/hold").json()["result"] == "held"
        bad = c.post("/api/v1/runs", json={**RUN, "afterok": ["rdeadbeef00"]})
        assert bad.status_code == 422 and "unknown run id 'rdeadbeef00'" in bad.text
        bad = c.post("/api/v1/runs", json={**RUN, "array": "5-1"})
        assert bad.status_code == 422 and "range 5-1 ends before it starts" in bad.text
        bad = c.post("/api/v1/runs/batch", json={"runs": [{**RUN, "hold": True}]})
        assert bad.status_code == 422 and "job control" in bad.text
        assert c.post("/api/v1/runs/rdeadbeef00/hold").status_code == 404
    # the remote CLI passes the flags and the verbs
    home = tmp_path / "laptop"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": "", "MLOPS_GPU_CONFIG": "",
           "MLOPS_GPU_URL": srv.url, "MLOPS_GPU_TOKEN": srv.tokens["mem"]}  # fmt: skip
    out = run_cli("submit", "-p", "p", "--array", "1,2", "--hold", "--", "true", cwd=home,
                  env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    aid2 = out.stdout.strip()
    rel = run_cli("release", aid2, cwd=home, env=env)
    # (the line local mode prints for an array id)
    assert rel.returncode == 0 and rel.stdout.strip() == f"{aid2}: 2 of 2 elements released"
    gone = run_cli("cancel", aid2, cwd=home, env=env)
    assert gone.stdout.splitlines() == [f"{aid2}_1: cancelled", f"{aid2}_2: cancelled"]
    nope = run_cli("cancel", "rdeadbeef00", cwd=home, env=env)
    assert nope.returncode == 2 and "no run with id 'rdeadbeef00'" in nope.stderr
    no_5xx(srv)


def test_what_a_submit_may_not_name(make_server: Callable[..., Server]) -> None:
    """A dependency on a run of a project the caller has no role in is refused exactly as one
    on an unknown id; a plain command naming a stored callable is refused (only
    ``POST /runs/call`` makes those); a begin time that is not finite is refused."""
    srv = make_server(None, "--no-scheduler")
    with srv.client("mem") as c, srv.client("qm") as q:
        theirs = q.post("/api/v1/runs", json={"command": ["true"], "project": "q"}).json()["id"]
        seen = c.post("/api/v1/runs", json={**RUN, "afterok": [theirs]})
        unknown = c.post("/api/v1/runs", json={**RUN, "afterok": ["rdeadbeef00"]})
        assert seen.status_code == unknown.status_code == 422
        assert seen.json()["error"]["message"] == unknown.json()["error"]["message"].replace(
            "rdeadbeef00", theirs
        )
        # an admin sees every project: the dependency stands
    with srv.client("root") as r:
        ok = r.post("/api/v1/runs", json={**RUN, "afterok": [theirs]})
        assert ok.status_code == 201, ok.text
    with srv.client("mem") as c:
        from mlops_gpu.config import load_config
        from mlops_gpu.controller.calls import calls_dir

        calls = calls_dir(load_config(srv.cfg))
        cmd = ["python", "-m", "mlops_gpu.sdk.call", str(calls / "someone-elses.pkl")]
        bad = c.post("/api/v1/runs", json={**RUN, "command": cmd})
        assert bad.status_code == 422 and "stored callable" in bad.text, bad.text
        for begin in ("now+1e308d", 1e400):
            raw = f'{{"command": ["true"], "project": "p", "begin": {json.dumps(begin)}}}'
            nan = c.post("/api/v1/runs", content=raw, headers={"Content-Type": "application/json"})
            assert nan.status_code == 422, nan.text
    no_5xx(srv)
