"""``pools:`` in the config (``config.pools``): what is accepted, the one-line error for each
bad key, the notice that the live scheduler does not act on pools, and ``simulate --autoscale``
reading them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_cli

from mlops_gpu.config import ConfigError
from mlops_gpu.config.locate import parse_config
from mlops_gpu.config.pools import not_acted_on
from mlops_gpu.model import Pool
from mlops_gpu.testing import config_yaml

VALID: dict[str, Any] = yaml.safe_load(config_yaml())
POOL = {
    "backend": "local",
    "gpu_type": "a100-80gb",
    "gpus_per_node": 8,
    "min_nodes": 0,
    "max_nodes": 4,
    "boot_s": 300.0,
    "price_per_node_hour": 20.0,
    "idle_s": 600.0,
}


def with_pool(**edits: Any) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    data["pools"] = {"burst": {**POOL, **edits}}
    return data


def test_a_pool_becomes_the_model_pool() -> None:
    cfg = parse_config(with_pool(), "c.yaml")
    assert cfg.pools["burst"].model("burst") == Pool(
        "burst", "local", "a100-80gb", 8, 0, 4, 300.0, 20.0, 600.0
    )
    assert parse_config(copy.deepcopy(VALID), "c.yaml").pools == {}


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        ({"backend": "aws"}, "pools.burst.backend: unknown backend 'aws' (expected one of local)"),
        ({"gpu_type": "h100"}, "pools.burst.gpu_type: unknown GPU type 'h100'"),
        ({"min_nodes": 5}, "pools.burst: min_nodes (5) must be at most max_nodes (4)"),
        ({"max_nodes": 0}, "pools.burst.max_nodes: Input should be greater than or equal to 1"),
        ({"gpus_per_node": "8"}, "pools.burst.gpus_per_node: Input should be a valid integer"),
        ({"boot_s": -1}, "pools.burst.boot_s: Input should be greater than or equal to 0"),
        ({"price_per_node_hour": -2.0}, "pools.burst.price_per_node_hour: Input should be"),
        ({"spot": True}, "pools.burst.spot: unknown key"),
    ],
)
def test_bad_pool_is_one_line_naming_the_key(edits: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(with_pool(**edits), "c.yaml")
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith("c.yaml: ")
    assert expected in text, text


def test_pools_are_said_to_be_not_acted_on() -> None:
    cfg = parse_config(with_pool(), "c.yaml")
    note = not_acted_on(cfg.pools, cfg.backends)
    assert note is not None and note.startswith("pools: burst configured but not acted on")
    assert not_acted_on({}, cfg.backends) is None


def test_simulate_autoscale_reads_the_configs_pool(tmp_path: Path) -> None:
    data = with_pool(max_nodes=2)
    (tmp_path / "mlops-gpu.yaml").write_text(yaml.safe_dump(data))
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration_s,gpus,project\n0,600,8,a\n0,600,8,b\n")
    r = run_cli("simulate", "--autoscale", "--trace", str(trace), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["pool"]["name"] == "burst" and out["pool"]["max_nodes"] == 2
    rows = {row["scaler"]: row for row in out["results"]}
    assert set(rows) == {"ours", "reactive", "always-on"}
    assert rows["ours"]["scale_ups"] == 2
    # ours: 2 nodes x (300 s boot + 600 s run + 600 s idle) at $20/node-hour
    assert rows["ours"]["cost_usd"] == pytest.approx(2 * 1500 / 3600 * 20)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--pool", "max_nodes=2"), "--pool: only with --autoscale"),
        (("--autoscale", "--pool", "max_nodes=x"), "--pool: max_nodes: expected an integer"),
        (
            ("--autoscale", "--pool", "gpus_per_node=8,max_nodes=2,min_nodes=3"),
            "--pool: min_nodes (3) must be at most max_nodes (2)",
        ),
        (("--autoscale", "--pool", "gpus_per_node=8,max_nodes=2,x=1"), "--pool: x: unknown key"),
        (("--autoscale", "--pool", "nope"), "--pool nope: no such pool"),
    ],
)
def test_simulate_autoscale_errors(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    (tmp_path / "mlops-gpu.yaml").write_text(yaml.safe_dump(with_pool()))
    r = run_cli("simulate", "--trace", "synthetic", *args, cwd=tmp_path)
    assert r.returncode != 0
    assert expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
