"""The SDK in remote mode against a real server on loopback, as from a laptop: ``mg.submit``
of a command and of a callable to the end, ``Run`` (status, wait, logs, result, cancel), with
no config, no store and no cluster on the client (the store cannot be opened there); the run's
user is the token's; a callable over the server's limit gets one clear line, and the raw route a
413 naming the limit; a request the cluster cannot take gets the local CLI's message."""

from __future__ import annotations

import base64
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from team.conftest import Server, no_5xx


def stored(srv: Server) -> int:
    """Runs in the server's store, as an admin sees them through the API (this side has no
    store to open)."""
    with srv.client("root") as c:
        return len(c.get("/api/v1/runs").json()["runs"])


def square_plus(x: int, plus: int = 0) -> int:
    return x * x + plus


def boom() -> None:
    raise RuntimeError("kaboom")


@pytest.fixture
def laptop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Server, str], None]]:
    """A client side with a clean HOME, a config path it cannot read, and a store that fails
    if anything opens it or asks a backend for its inventory."""
    from mlops_gpu.backends.local import LocalBackend
    from mlops_gpu.state import Store

    home = tmp_path / "laptop"
    home.mkdir()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)

    def opened(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the client opened the store")

    def inventory(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the client asked a backend for its inventory")

    def login(srv: Server, who: str) -> None:
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
        monkeypatch.setenv("MLOPS_GPU_CONFIG", str(locked / "mlops-gpu.yaml"))
        monkeypatch.setenv("MLOPS_GPU_USER", "root")  # ignored in remote mode
        monkeypatch.setattr(Store, "__init__", opened)
        monkeypatch.setattr(LocalBackend, "inventory", inventory)
        monkeypatch.setenv("MLOPS_GPU_URL", srv.url)
        monkeypatch.setenv("MLOPS_GPU_TOKEN", srv.tokens[who])

    yield login
    locked.chmod(0o700)
    assert not (home / ".config" / "mlops-gpu" / "mlops-gpu.yaml").exists()


def test_sdk_submits_commands_and_callables_to_the_end(
    make_server: Callable[..., Server], store_url: str, laptop: Callable[[Server, str], None]
) -> None:
    import mlops_gpu as mg
    from mlops_gpu.sdk.remote import RemoteRun

    srv = make_server(store_url)
    laptop(srv, "mem")
    cmd = mg.submit("sh -c 'echo out; echo err >&2'", project="p", gpus=1)
    fn = mg.submit(square_plus, project="p", gpus=1, args=(7,), kwargs={"plus": 1})
    bad = mg.submit(boom, project="p", gpus=0, cpu_milli=100)
    assert isinstance(cmd, mg.Run) and isinstance(cmd, RemoteRun)
    assert cmd.wait(timeout=120) == "succeeded"
    assert cmd.status == "succeeded" and cmd.done()
    assert cmd.logs() == "out\nerr\n" and cmd.logs(stderr=False) == "out\n"
    assert fn.result(timeout=120) == 50
    info = fn.info()
    assert (info["user"], info["name"], info["project"]) == ("mem", "square_plus", "p")
    with pytest.raises(mg.RunFailed, match="kaboom"):
        bad.result(timeout=120)
    with pytest.raises(TypeError, match="is a command, not a callable"):
        cmd.result()
    again = mg.get_run(fn.id)
    assert again.result() == 50 and again.info() == info
    with pytest.raises(KeyError):
        mg.get_run("r0000000000")
    long = mg.submit(["sleep", "600"], project="p", gpus=1)
    assert long.cancel() in ("cancelled", "running", "starting", "admitted", "pending")
    assert long.wait(timeout=120) == "cancelled"
    no_5xx(srv)


def test_a_request_the_cluster_cannot_take_gets_the_local_message(
    make_server: Callable[..., Server], laptop: Callable[[Server, str], None]
) -> None:
    import mlops_gpu as mg
    from mlops_gpu.controller import Runtime, SubmitError
    from mlops_gpu.model import ResourceRequest

    srv = make_server(None, "--no-scheduler")
    local = Runtime.load(srv.cfg)  # what local mode says, on the server's side
    spec = local.spec(("true",), project="p", request=ResourceRequest(gpu_types=("h100-nope",)))
    want = "; ".join(local.problems(spec))
    assert "h100-nope" in want
    laptop(srv, "mem")
    with pytest.raises(SubmitError) as remote:
        mg.submit(["true"], project="p", gpus=1, gpu_type="h100-nope")
    with pytest.raises(SubmitError) as fn:
        mg.submit(square_plus, project="p", gpus=1, gpu_type="h100-nope", args=(1,))
    assert stored(srv) == 0
    assert want in str(remote.value) and want in str(fn.value)
    no_5xx(srv)


def test_a_callable_over_the_limit_gets_a_clear_error(
    make_server: Callable[..., Server], laptop: Callable[[Server, str], None]
) -> None:
    import mlops_gpu as mg
    from mlops_gpu.controller import SubmitError

    srv = make_server(None, "--no-scheduler", extra={"server": {"max_call_bytes": 4096}})
    laptop(srv, "mem")
    with pytest.raises(SubmitError, match=r"over the server's limit of 4096 bytes "
                       r"\(server.max_call_bytes\)"):  # fmt: skip
        mg.submit(square_plus, project="p", args=(b"x" * 10_000,))
    small = mg.submit(square_plus, project="p", args=(3,))  # under it: queued
    assert small.status == "pending"
    body = {"project": "p", "payload": base64.b64encode(pickle.dumps(b"x" * 5000)).decode()}
    with srv.client("mem") as c:
        r = c.post("/api/v1/runs/call", json=body)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["message"] == (
            "the callable's payload is over the server's limit of 4096 bytes "
            "(server.max_call_bytes)"
        )
        body["payload"] = base64.b64encode(b"x" * 40_000).decode()
        r = c.post("/api/v1/runs/call", json=body)  # refused from its size alone
        assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"], r.text
        r = c.post("/api/v1/runs/call", json={**body, "payload": "bm90IGEgcGlja2xl"})
        assert r.status_code == 422 and "not a pickle" in r.text
        r = c.post("/api/v1/runs/call", json={**body, "payload": "!!"})
        assert r.status_code == 422 and "base64" in r.text
        r = c.post("/api/v1/runs/call", json={**body, "command": ["cat", "/etc/passwd"]})
        assert r.status_code == 422, r.text
        # the general body limit stays for other routes
        r = c.post("/api/v1/runs", json={"command": ["x" * 2_000_000], "project": "p"})
        assert r.status_code == 413, r.text
    assert stored(srv) == 1
    calls = srv.cfg.parent / "state" / "calls"
    assert len(list(calls.glob("*.pkl"))) == 1  # refused payloads leave no file
    no_5xx(srv)


def test_a_lease_needs_local_mode(laptop: Callable[[Server, str], None], tmp_path: Path) -> None:
    """``mg.gpus`` holds GPUs of this host: against a server it says so, opening nothing."""
    import mlops_gpu as mg

    srv = Server("http://127.0.0.1:9", tmp_path / "none.yaml", None, tmp_path / "none.log")  # type: ignore[arg-type]
    srv.tokens["mem"] = "t"
    laptop(srv, "mem")
    with pytest.raises(mg.LeaseError, match="needs local mode"), mg.gpus(1, project="p"):
        pass


def test_run_update_goes_through_the_server(
    make_server: Callable[..., Server], laptop: Callable[[Server, str], None]
) -> None:
    """``Run.update`` in remote mode is ``PATCH /runs/{id}``: a pending run's priority changes
    (an ``updated`` event, by the token's user); a refused change is a one-line ValueError."""
    import mlops_gpu as mg

    srv = make_server(None, "--no-scheduler")  # nothing admits: the run stays pending
    laptop(srv, "mem")
    run = mg.submit(["true"], project="p", gpus=1)
    assert run.update(priority="high") is run
    info = run.info()
    assert info["priority"] == "high" and info["phase"] == "pending"
    with srv.client("root") as c:
        events = c.get(f"/api/v1/runs/{run.id}", params={"events": "true"}).json()["events"]
    assert [e["kind"] for e in events].count("updated") == 1
    with pytest.raises(ValueError, match="gpu"):
        run.update(gpus=100000)
    with pytest.raises(ValueError):
        mg.get_run(run.id).update(priority="no-such-class")
    no_5xx(srv)


def test_job_control_travels_with_a_remote_submit(
    make_server: Callable[..., Server], laptop: Callable[[Server, str], None]
) -> None:
    """``mg.submit``'s dependencies, hold and begin time go in the request (commands and
    callables alike); ``Run.hold``/``release`` go through the API."""
    import mlops_gpu as mg

    srv = make_server(None, "--no-scheduler")
    laptop(srv, "mem")
    first = mg.submit(["true"], project="p", gpus=1, hold=True)
    then = mg.submit(["true"], project="p", gpus=1, afterok=first, begin="now+1h")
    fn = mg.submit(square_plus, project="p", gpus=1, args=(2,), after=[first.id], hold=True)
    with srv.client("root") as c:
        stored = {r["id"]: r for r in c.get("/api/v1/runs").json()["runs"]}
    assert stored[first.id]["reason_code"] == "held" and stored[fn.id]["reason_code"] == "held"
    assert first.release() == "released" and first.hold() == "held"
    assert then.info()["phase"] == "pending"
    from mlops_gpu.controller import SubmitError

    with pytest.raises(SubmitError, match="unknown run id"):
        mg.submit(["true"], project="p", gpus=1, afterok="rdeadbeef00")
    no_5xx(srv)


def test_a_runs_mlflow_run_comes_from_the_server(
    make_server: Callable[..., Server], tmp_path: Path, laptop: Callable[[Server, str], None]
) -> None:
    """``Run.mlflow_run_id`` in remote mode: the server reads its store's ``mlflow_runs``
    (``GET /runs/ID?mlflow=true``), the MLflow run its scheduler made for the attempt."""
    from mlflow.tracking import MlflowClient

    import mlops_gpu as mg

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    srv = make_server(None, extra={"mlflow": {"tracking_uri": tracking}})
    laptop(srv, "mem")
    run = mg.submit("true", project="p", gpus=1)
    assert run.wait(timeout=180) == "succeeded"
    # (a launch waits for MLflow briefly: the server's first opens its store, so the MLflow
    # run may be made after the launch, and noted then)
    deadline = time.monotonic() + 120
    while run.mlflow_run_id is None and time.monotonic() < deadline:
        time.sleep(0.5)
    client = MlflowClient(tracking)
    exps = [e.experiment_id for e in client.search_experiments()]
    (made,) = client.search_runs(exps, f"tags.`mlops_gpu.run_id` = '{run.id}'")
    assert run.mlflow_run_id == made.info.run_id
    with srv.client("mem") as c:
        assert "mlflow_run_id" not in c.get(f"/api/v1/runs/{run.id}").json()  # (asked only)
        got = c.get(f"/api/v1/runs/{run.id}", params={"mlflow": "true"}).json()
    assert got["mlflow_run_id"] == made.info.run_id
    no_5xx(srv)
