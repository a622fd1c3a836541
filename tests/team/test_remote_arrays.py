"""Arrays in remote mode print what local mode prints, against a real server: ``status
ARRAY_ID`` (its elements), ``queue``/``status`` folding an array into one line unless
``--expand``, and ``hold``/``release``/``cancel``/``update`` of an array id (``PATCH`` of an
array id changes its pending elements)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_cli

from team.conftest import Server, no_5xx


def same(text: str) -> str:
    """A table without its AGE cells (the clock moves on) and the padding that follows."""
    return re.sub(r"│\d+[smhd]│", "│AGE│", re.sub(r"[ ─━┈]+", "", text))


@pytest.mark.timeout(1200)  # some 25 CLI processes
def test_array_ids_remotely_as_locally(make_server: Callable[..., Server], tmp_path: Path) -> None:
    srv = make_server()
    home = tmp_path / "laptop"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": "", "MLOPS_GPU_CONFIG": "",
           "MLOPS_GPU_USER": "mem", "MLOPS_GPU_URL": srv.url,
           "MLOPS_GPU_TOKEN": srv.tokens["mem"]}  # fmt: skip

    def remote(*args: str) -> tuple[int, str, str]:
        r = run_cli(*args, cwd=home, env=env)
        return r.returncode, r.stdout, r.stderr

    def local(*args: str) -> tuple[int, str, str]:
        r = run_cli("--config", str(srv.cfg), *args, env={"MLOPS_GPU_USER": "mem"})
        return r.returncode, r.stdout, r.stderr

    # (held, and after that not before an hour: released elements stay pending)
    rc, out, err = remote("submit", "-p", "p", "--hold", "--begin", "now+1h", "--array",
                          "0-3%2", "-n", "sweep", "--", "true")  # fmt: skip
    assert rc == 0, err
    aid = out.strip()
    rc, out, err = remote("submit", "-p", "p", "--hold", "-n", "single", "--", "true")
    single = out.strip()
    elements = [f"{aid}_{i}" for i in range(4)]
    for args in (("status", aid, single, "--json"), ("queue", "--json")):
        r, lo = remote(*args), local(*args)
        assert r[0] == 0 and lo[0] == 0, (r, lo)
        assert json.loads(r[1]) == json.loads(lo[1]), args
    got = json.loads(remote("status", aid, "--json")[1])
    assert [x["id"] for x in got] == elements
    assert [(x["array_id"], x["array_index"]) for x in got] == [(aid, i) for i in range(4)]
    for args in (("status", aid), ("queue",), ("queue", "--expand")):
        r, lo = remote(*args), local(*args)
        assert r[0] == 0, r
        assert same(r[1]) == same(lo[1]), (args, r[1], lo[1])
        if args == ("queue",):  # folded, unless --expand
            assert "sweep [4 elements]" in r[1] and f"{aid}_1" not in r[1] and single in r[1]
        if args == ("queue", "--expand"):
            assert f"{aid}_1" in r[1] and "elements]" not in r[1]
    # unknown ids: the same one-line error
    r, lo = remote("status", "r0000000000"), local("status", "r0000000000")
    assert (r[0], r[2]) == (lo[0], lo[2]) == (2, "mlops-gpu: error: no run with id 'r0000000000'\n")
    # hold / release / cancel of the array id
    assert remote("hold", aid)[1] == local("hold", aid)[1] == f"{aid}: 0 of 4 elements held\n"
    assert remote("release", aid)[1] == f"{aid}: 4 of 4 elements released\n"
    assert local("hold", aid)[1] == f"{aid}: 4 of 4 elements held\n"
    assert remote("release", single)[1] == f"{single}: released\n"
    # update of the array id (PATCH /runs/{array id}): every pending element, a line each
    rc, out, err = remote("update", aid, "--priority", "high")
    assert rc == 0 and out.splitlines() == [
        f"{e}: updated by user: priority normal -> high" for e in elements
    ], err
    r, lo = remote("update", aid, "--priority", "high", "--json"), local(
        "update", aid, "--priority", "high", "--json")  # fmt: skip
    assert r[0] == 0 and json.loads(r[1]) == json.loads(lo[1]), (r, lo)
    assert [x["priority"] for x in json.loads(r[1])] == ["high"] * 4
    r, lo = remote("update", aid, "--gpus", "9"), local("update", aid, "--gpus", "9")
    assert r[0] == lo[0] == 2 and "gpus: 9 GPUs per node" in lo[2], (r, lo)
    # (remote mode names the server before the server's message)
    assert r[2] == lo[2].replace("error: ", f"error: {srv.url}: "), (r, lo)
    r = remote("update", "r0000000000", "--gpus", "1")
    assert r[2] == "mlops-gpu: error: no run with id 'r0000000000'\n", r
    with srv.client("vic") as c:  # a viewer of p may not
        assert c.patch(f"/api/v1/runs/{aid}", json={"priority": "low"}).status_code == 403
    rc, out, err = remote("cancel", aid)
    assert rc == 0 and out.splitlines() == [f"{e}: cancelled" for e in elements], err
    r = remote("update", aid, "--priority", "low")
    assert r[0] == 2 and f"array {aid} has no pending element" in r[2], r
    no_5xx(srv)
