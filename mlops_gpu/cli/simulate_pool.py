"""``simulate --autoscale``: which pool to replay on (``--pool``, or the config's one pool), and
the table of the scalers side by side.

``--pool`` is a pool name of the config, or ``key=value`` pairs separated by commas with the keys
of ``pools.NAME`` (``backend`` and ``gpu_type`` may be left out here); either way it is validated
as the config validates pools, with the key that is wrong named.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from mlops_gpu.config.pools import PoolConfig
from mlops_gpu.model import Pool

EXAMPLE = "max_nodes=64,gpus_per_node=8,boot_s=300,price_per_node_hour=10,idle_s=600"
_FLOATS = {"boot_s", "price_per_node_hour", "idle_s"}
_INTS = {"gpus_per_node", "min_nodes", "max_nodes"}


def _error(message: str) -> Exception:
    """The CLI's ``UserError`` (imported late: ``cli.main`` imports the verbs)."""
    from mlops_gpu.cli.common import UserError as Error

    return Error(message)


def _spec(text: str) -> Pool:
    data: dict[str, Any] = {"backend": "sim", "gpu_type": "gpu"}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise _error(f"--pool: expected key=value pairs such as {EXAMPLE}, got {part!r}")
        try:
            if key in _INTS:
                data[key] = int(value)
            elif key in _FLOATS:
                data[key] = float(value)
            else:
                data[key] = value.strip()
        except ValueError:
            kind = "an integer" if key in _INTS else "a number"
            raise _error(f"--pool: {key}: expected {kind}, got {value!r}") from None
    try:
        return PoolConfig.model_validate(data).model("cli")
    except ValidationError as e:
        problems = []
        for err in e.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            where = ".".join(str(p) for p in err["loc"])
            problems.append(f"{where}: {msg}" if where else msg)
        raise _error(f"--pool: {'; '.join(problems)}") from None


def choose_pool(spec: str | None, config_path: str | None) -> Pool:
    """The pool ``--pool`` names or describes, or the config's only pool."""
    if spec is not None and "=" in spec:
        return _spec(spec)
    from mlops_gpu.config import ConfigError, find_config, load_config

    found = find_config(config_path)
    if found is None:
        raise _error(f"--autoscale: no config with pools found; give --pool {EXAMPLE}")
    try:
        cfg = load_config(found)
    except ConfigError as e:
        raise _error(str(e)) from None
    pools = cfg.pools
    if spec is None:
        if len(pools) != 1:
            raise _error(
                f"--autoscale: {found} has {len(pools)} pools; name one with --pool NAME"
                f" ({', '.join(sorted(pools)) or f'or give --pool {EXAMPLE}'})"
            )
        spec = next(iter(pools))
    if spec not in pools:
        raise _error(
            f"--pool {spec}: no such pool in {found} (pools: {', '.join(sorted(pools)) or 'none'})"
        )
    return pools[spec].model(spec)


def table(out: dict[str, Any]) -> None:
    from mlops_gpu.cli.render import results_table

    p = out["pool"]
    title = (f"{out['trace']}: {out['jobs']} jobs, pool of up to {p['max_nodes']} x "
             f"{p['gpus_per_node']} GPUs, boot {p['boot_s']:g} s, "
             f"${p['price_per_node_hour']:g}/node-hour")  # fmt: skip
    cols = [
        ("policy", "policy", "{}"),
        ("node-h", "node_hours", "{:.0f}"),
        ("cost $", "cost_usd", "{:.0f}"),
        ("scale ups", "scale_ups", "{}"),
        ("scale downs", "scale_downs", "{}"),
        ("avg JCT h", "avg_jct_s", "h"),
        ("p99 wait h", "p99_wait_s", "h"),
        ("wall s", "wall_s", "{:.1f}"),
    ]
    results_table(title, cols, out["results"])
