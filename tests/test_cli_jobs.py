"""``update``, ``history`` and ``--user``/``--mine`` end to end on the local backend, as a user
types them: real processes, the scheduler run a cycle at a time (``scheduler --once``)."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

from conftest import run_cli

from mlops_gpu.testing import config_yaml


def cli(cfg: Path, *args: str, user: str = "alice") -> tuple[int, str, str]:
    r = run_cli("--config", str(cfg), *args, env={"MLOPS_GPU_USER": user})
    return r.returncode, r.stdout, r.stderr


def js(cfg: Path, *args: str, user: str = "alice") -> Any:
    rc, out, err = cli(cfg, *args, "--json", user=user)
    assert rc == 0, err
    return json.loads(out)


def settle(cfg: Path, ids: list[str], timeout: float = 60) -> dict[str, dict[str, Any]]:
    """Scheduler cycles until every run in ``ids`` has ended."""
    deadline = time.monotonic() + timeout
    while True:
        runs = {r["id"]: r for r in js(cfg, "status", *ids)}
        if all(r["phase"] in ("succeeded", "failed", "cancelled") for r in runs.values()):
            return runs
        assert time.monotonic() < deadline, runs
        assert cli(cfg, "scheduler", "--once")[0] == 0
        time.sleep(0.3)


def test_update_of_a_pending_runs_priority_changes_its_order(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(nodes=[("node-a", 2)], projects={"p": (2, 0)}))
    sub = ("submit", "--no-start", "-p", "p", "-g", "2", "--grace", "1s", "--", "sleep", "30")
    first, second = (cli(cfg, *sub)[1].strip() for _ in range(2))
    assert [r["id"] for r in js(cfg, "queue")] == [first, second]
    rc, out, err = cli(cfg, "update", second, "--priority", "high")
    assert (rc, out) == (0, f"{second}: updated by user: priority normal -> high\n"), err
    assert [r["id"] for r in js(cfg, "queue")] == [second, first]
    (run,) = js(cfg, "status", second, "--events")
    assert run["priority"] == "high"
    assert [(e["kind"], e["reason"]) for e in run["events"]][-1] == (
        "updated", "updated by user: priority normal -> high")  # fmt: skip
    # the scheduler takes the raised run first
    assert cli(cfg, "scheduler", "--once")[0] == 0
    phases = {r["id"]: r["phase"] for r in js(cfg, "status", first, second)}
    assert phases[first] == "pending" and phases[second] in ("starting", "running"), phases
    # bad input: one line, exit status 2, nothing changed
    for args, msg in (
        (["--gpus", "9"], "gpus: 9 GPUs per node"),
        (["--priority", "top"], "priority: unknown priority class 'top'"),
        (["--max-runtime", "soon"], "expected a duration such as 90s"),
        ([], "nothing to update"),
    ):
        rc, out, err = cli(cfg, "update", first, *args)
        assert rc == 2 and err.startswith("mlops-gpu: error: ") and msg in err, err
        assert len(err.strip().splitlines()) == 1 and out == ""
    rc, _, err = cli(cfg, "update", "r0000000000", "--gpus", "1")
    assert rc == 2 and "no run with id 'r0000000000'" in err
    cli(cfg, "cancel", first, second)
    settle(cfg, [first, second])


def test_a_running_run_refuses_gpus_and_stops_at_a_shortened_max_runtime(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(nodes=[("node-a", 2)], projects={"p": (2, 0)}))
    rc, out, err = cli(cfg, "submit", "--no-start", "-p", "p", "--grace", "1s", "--",
                       "sleep", "60")  # fmt: skip
    rid = out.strip()
    deadline = time.monotonic() + 30
    while js(cfg, "status", rid)[0]["phase"] != "running":
        assert time.monotonic() < deadline
        cli(cfg, "scheduler", "--once")
    rc, out, err = cli(cfg, "update", rid, "--gpus", "2")
    assert rc == 2 and err.strip() == (
        f"mlops-gpu: error: run {rid} is running: only --priority and a shorter --max-runtime "
        "can change once a run is admitted (not --gpus)"
    )
    assert js(cfg, "status", rid)[0]["gpus"] == 1
    rc, out, err = cli(cfg, "update", rid, "--max-runtime", "1s")
    assert rc == 0 and out == f"{rid}: updated by user: max_runtime none -> 1s\n", err
    rc, out, err = cli(cfg, "update", rid, "--max-runtime", "1h")
    assert rc == 2 and "can only be shortened" in err
    runs = settle(cfg, [rid])
    assert runs[rid]["phase"] == "failed"
    assert runs[rid]["reason"] == "stopped after exceeding max_runtime 1s"


def test_history_with_json_csv_and_user_filters(tmp_path: Path) -> None:
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(projects={"p": (4, 0), "q": (4, 0)}))
    ids = {}
    for name, user, project, cmd in (
        ("ok", "alice", "p", ["true"]),
        ("bad", "bob", "p", ["sh", "-c", "exit 3"]),
        ("other", "alice", "q", ["sleep", "1"]),
    ):
        rc, out, err = cli(cfg, "submit", "--no-start", "-p", project, "-n", name, "--", *cmd,
                           user=user)  # fmt: skip
        assert rc == 0, err
        ids[name] = out.strip()
    # --user/--mine on queue and status (MLOPS_GPU_USER is who "I" am locally)
    assert {r["id"] for r in js(cfg, "queue", "--mine")} == {ids["ok"], ids["other"]}
    assert [r["id"] for r in js(cfg, "queue", "--user", "bob", user="x")] == [ids["bad"]]
    assert [r["id"] for r in js(cfg, "status", "--mine", user="bob")] == [ids["bad"]]
    assert js(cfg, "status", "--user", "carol") == []
    rc, _, err = cli(cfg, "queue", "--mine", "--user", "bob")
    assert rc == 2 and "--user and --mine: give one of them, not both" in err
    settle(cfg, list(ids.values()))
    rows = js(cfg, "history")
    assert rows[0]["id"] == ids["other"]  # newest end first (it slept)
    by = {r["name"]: r for r in rows}
    assert set(by) == {"ok", "bad", "other"}
    assert (by["ok"]["phase"], by["ok"]["exit_code"], by["ok"]["attempts"]) == ("succeeded", 0, 1)
    assert (by["bad"]["phase"], by["bad"]["exit_code"], by["bad"]["user"]) == ("failed", 3, "bob")
    other = by["other"]
    assert other["elapsed_s"] >= 1.0 and other["gpu_hours"] > 0
    assert other["cost_usd"] == round(other["gpu_hours"] * 2.5, 6) or abs(
        other["cost_usd"] - other["gpu_hours"] * 2.5) < 1e-5  # fmt: skip
    assert other["lost_gpu_hours"] == 0.0 and other["gpu_type"] == "a100-80gb"
    # --csv parses back to the same rows
    rc, out, err = cli(cfg, "history", "--csv")
    assert rc == 0, err
    parsed = list(csv.DictReader(io.StringIO(out)))
    assert [r["id"] for r in parsed] == [r["id"] for r in rows]
    assert {k: str(v) if v is not None else "" for k, v in rows[0].items()} == parsed[0]
    # filters
    assert {r["name"] for r in js(cfg, "history", "--mine")} == {"ok", "other"}
    assert {r["name"] for r in js(cfg, "history", "--user", "bob")} == {"bad"}
    assert {r["name"] for r in js(cfg, "history", "-p", "q")} == {"other"}
    assert [r["name"] for r in js(cfg, "history", "--limit", "1")] == ["other"]
    assert js(cfg, "history", "--since", "2999-01-01T00:00") == []
    assert len(js(cfg, "history", "--since", "10m")) == 3
    rc, out, err = cli(cfg, "history")
    assert rc == 0 and "History: 3 finished since" in out and "exit 3" not in out, err
    rc, _, err = cli(cfg, "history", "--since", "yesterday")
    assert rc == 2 and err.startswith("mlops-gpu: error: --since: expected an age such as 2h")


def test_history_and_report_csv_quote_commas_quotes_and_newlines(tmp_path: Path) -> None:
    """Values with the CSV's own separators (a name, a user, a failure reason) parse back
    unchanged: the writers quote them (the ``csv`` module), they are not joined by hand."""
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(projects={"p": (4, 0)}))
    name, user = 'a,"b"\nc', 'eve,"x"'
    rc, out, err = cli(cfg, "submit", "--no-start", "-p", "p", "-n", name, "--",
                       "sh", "-c", 'echo "1,2" && exit 4', user=user)  # fmt: skip
    assert rc == 0, err
    rid = out.strip()
    settle(cfg, [rid])
    (row,) = js(cfg, "history")
    rc, out, err = cli(cfg, "history", "--csv")
    assert rc == 0, err
    (parsed,) = list(csv.DictReader(io.StringIO(out)))
    assert (parsed["name"], parsed["user"], parsed["exit_code"]) == (row["name"], user, "4")
    assert parsed == {k: "" if v is None else str(v) for k, v in row.items()}
    rc, out, err = cli(cfg, "report", "--by", "user", "--format", "csv")
    assert rc == 0, err
    (rep,) = list(csv.DictReader(io.StringIO(out)))
    assert rep["user"] == user


def test_a_run_stopped_for_a_shortened_max_runtime_that_exits_0_still_fails(
    tmp_path: Path,
) -> None:
    """The controller stops it (its limit was shortened after launch); it traps SIGTERM and
    exits 0. It ran past its max runtime: failed with that reason, as when the backend's own
    limit stops it, not succeeded."""
    cfg = tmp_path / "mlops-gpu.yaml"
    cfg.write_text(config_yaml(nodes=[("node-a", 2)], projects={"p": (2, 0)}))
    rc, out, err = cli(cfg, "submit", "--no-start", "-p", "p", "--grace", "5s", "--", "sh", "-c",
                       "trap 'echo trapped; exit 0' TERM; sleep 60 & wait")  # fmt: skip
    assert rc == 0, err
    rid = out.strip()
    deadline = time.monotonic() + 30
    while js(cfg, "status", rid)[0]["phase"] != "running":
        assert time.monotonic() < deadline
        cli(cfg, "scheduler", "--once")
    rc, out, err = cli(cfg, "update", rid, "--max-runtime", "1s")
    assert rc == 0, err
    runs = settle(cfg, [rid])
    assert runs[rid]["phase"] == "failed", runs[rid]
    assert runs[rid]["reason"] == "stopped after exceeding max_runtime 1s"
    (row,) = js(cfg, "history")
    assert (row["phase"], row["exit_code"]) == ("failed", 0)
    rc, out, err = cli(cfg, "logs", rid)
    assert rc == 0 and "trapped" in out, (out, err)
