"""The config file: where it is found, how a bad one is reported, how its paths resolve, and
the commented starter that ``mlops-gpu init`` writes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlops_gpu.config import Config, ConfigError, load_config, starter_config
from mlops_gpu.config.locate import parse_config
from mlops_gpu.config.starter import StarterNode
from mlops_gpu.testing import config_yaml

VALID: dict[str, Any] = yaml.safe_load(config_yaml())
NODE = ("backends", "local", "nodes", 0)


def mutated(*edits: tuple[tuple[Any, ...], Any]) -> str:
    """The valid config's text with ``(key path, value)`` edits applied."""
    data = copy.deepcopy(VALID)
    for path, value in edits:
        parent = data
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = value
    return yaml.safe_dump(data, sort_keys=False)


# -- where the config is found ------------------------------------------------------------


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Candidate config paths, with the real user config dir and env kept out of the way."""
    monkeypatch.delenv("MLOPS_GPU_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")  # no ./mlops-gpu.yaml unless a test moves there
    return {
        "explicit": tmp_path / "explicit" / "custom.yaml",
        "env": tmp_path / "env" / "from-env.yaml",
        "cwd": tmp_path / "cwd" / "mlops-gpu.yaml",
        "xdg": tmp_path / "xdg" / "mlops-gpu" / "mlops-gpu.yaml",
    }


@pytest.mark.parametrize(
    ("present", "winner"),
    [
        pytest.param({"explicit", "env", "cwd", "xdg"}, "explicit", id="explicit-beats-all"),
        pytest.param({"env", "cwd", "xdg"}, "env", id="env-beats-cwd-and-xdg"),
        pytest.param({"cwd", "xdg"}, "cwd", id="cwd-beats-xdg"),
        pytest.param({"xdg"}, "xdg", id="xdg-last"),
    ],
)
def test_search_order(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch, present: set[str], winner: str
) -> None:
    for place in present:  # each file names its own project after where it lies
        places[place].parent.mkdir(parents=True, exist_ok=True)
        places[place].write_text(config_yaml(projects={place: (4, 0)}))
    if "env" in present:
        monkeypatch.setenv("MLOPS_GPU_CONFIG", str(places["env"]))
    if "cwd" in present:
        monkeypatch.chdir(places["cwd"].parent)
    cfg = load_config(places["explicit"] if "explicit" in present else None)
    assert set(cfg.projects) == {winner}
    assert cfg.source is not None
    assert cfg.source.resolve() == places[winner].resolve()
    assert cfg.root == places[winner].parent.resolve()


def test_no_config_anywhere_points_at_init(places: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="mlops-gpu init") as e:
        load_config()
    assert "\n" not in str(e.value)


def test_env_naming_a_missing_file_does_not_fall_back(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    places["xdg"].parent.mkdir(parents=True)
    places["xdg"].write_text(config_yaml())
    monkeypatch.setenv("MLOPS_GPU_CONFIG", str(places["env"]))
    with pytest.raises(ConfigError, match="no such file"):
        load_config()


# -- bad configs --------------------------------------------------------------------------

QUOTA = ("projects", "p", "quotas", "a100-80gb")
LOOP = {"org": {}, "a": {"parent": "b"}, "b": {"parent": "a"}}
# id: (file content (None: no file), what the message must name)
BAD_CONFIGS: dict[str, tuple[str | bytes | None, str]] = {
    "unknown-top-level-key": (mutated((("bogus",), 1)), "bogus: unknown key"),
    "unknown-nested-key": (mutated(((*QUOTA, "nominl"), 1)), ".a100-80gb.nominl: unknown key"),
    "negative-nominal": (mutated(((*QUOTA, "nominal"), -1)), "projects.p.quotas.a100-80gb.nominal"),
    "node-gpus-0": (mutated(((*NODE, "gpus"), 0)), "backends.local.nodes.0.gpus"),
    "node-gpus-and-devices": (mutated(((*NODE, "devices"), ["0"])), "backends.local.nodes.0"),
    "quota-unknown-gpu-type": (mutated(((*QUOTA[:3], "h100"), {})), "projects.p.quotas.h100"),
    "node-unknown-gpu-type": (mutated(((*NODE, "gpu_type"), "h1")), "local.nodes.0.gpu_type"),
    "project-unknown-cohort": (mutated((("projects", "p", "cohort"), "x")), "projects.p.cohort"),
    "cohort-loop": (mutated((("cohorts",), LOOP)), "cohorts.a.parent"),
    "default-priority-not-a-class": (mutated((("default_priority",), "x")), "default_priority"),
    "wrong-type": (mutated(((*NODE, "gpus"), "four")), "backends.local.nodes.0.gpus"),
    "malformed-yaml": ("store: [unclosed\nfoo: 1\n", "malformed YAML: line 2"),
    "empty-file": ("", "empty"),
    "comment-only-file": ("# only a comment\n", "empty"),
    "top-level-list": ("- a\n- b\n", "(top level)"),
    "missing-file": (None, "no such file"),
    "newline-in-key": (mutated(((*QUOTA, "x\ny"), 1)), "projects.p.quotas.a100-80gb."),
    "newline-in-backend-type": (mutated(((*NODE[:2], "type"), "sl\nurm")), "backends.local"),
    "not-utf8": (b'store: "\xff\xfe"\n', "not valid UTF-8"),
    "duplicate-key": ("store: sqlite:///a.db\nstore: sqlite:///b.db\n", "duplicate key 'store'"),
    "bool-is-not-a-count": (mutated(((*NODE, "gpus"), True)), "backends.local.nodes.0.gpus"),
    "absurd-gpu-count": (mutated(((*NODE, "gpus"), 10**9)), "backends.local.nodes.0.gpus"),
    "string-is-not-a-count": (mutated(((*QUOTA, "nominal"), "4")), ".a100-80gb.nominal"),
    "gpu-type-name-too-long": (
        mutated((("gpu_types", "g" * 101), {"price_per_hour": 1.0})),
        "gpu_types: a name of 101 characters",
    ),
    "lease-shorter-than-3-ticks": (
        mutated((("scheduler",), {"tick_s": 5, "lease_s": 10})),
        "scheduler: lease_s (10) must be at least 3 x tick_s (5)",
    ),
}


@pytest.mark.parametrize(
    ("content", "names"),
    [pytest.param(*v, id=k) for k, v in BAD_CONFIGS.items()],
)
def test_bad_config_is_one_line_naming_file_and_key(
    tmp_path: Path, content: str | bytes | None, names: str
) -> None:
    path = tmp_path / "mlops-gpu.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: ")
    assert names in msg
    assert "\n" not in msg and "\r" not in msg


# -- paths --------------------------------------------------------------------------------

ELSEWHERE_DB = "sqlite:///{elsewhere}/s.db"
PG = "postgresql+psycopg://u@h/db"


@pytest.mark.parametrize(
    ("store", "state_dir", "want_store", "want_state"),
    [
        ("sqlite:///state.db", "state", "sqlite:///{root}/state.db", "{root}/state"),
        ("sqlite:///db/s.db", "var/st", "sqlite:///{root}/db/s.db", "{root}/var/st"),
        (ELSEWHERE_DB, "{elsewhere}/st", ELSEWHERE_DB, "{elsewhere}/st"),
        (PG, "state", PG, "{root}/state"),
    ],
    ids=["relative", "relative-nested", "absolute", "postgres-url-kept"],
)
def test_relative_paths_resolve_against_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str, state_dir: str,
    want_store: str, want_state: str,
) -> None:  # fmt: skip
    folder, cwd = tmp_path / "cfg", tmp_path / "cwd"
    folder.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # cwd must not matter
    fill = {"root": str(folder.resolve()), "elsewhere": str((tmp_path / "abs").resolve())}
    path = folder / "mlops-gpu.yaml"
    extra = {"store": store.format(**fill), "state_dir": state_dir.format(**fill)}
    path.write_text(config_yaml(extra=extra))
    cfg = load_config(path)
    assert cfg.store_url == want_store.format(**fill)
    assert cfg.state_path == Path(want_state.format(**fill))


ENV = {"MLFLOW_TRACKING_URI": "http://env:5000"}


@pytest.mark.parametrize(
    ("configured", "environ", "want"),
    [
        ("http://cfg:5000", ENV, "http://cfg:5000"),
        (None, ENV, "http://env:5000"),
        (None, {}, "sqlite:///{root}/state/mlflow.db"),
        ("sqlite:///ml.db", {}, "sqlite:///{root}/ml.db"),
    ],
    ids=["config-wins", "env-else", "default-under-state-dir", "relative-sqlite-in-config"],
)
def test_tracking_uri(
    tmp_path: Path, configured: str | None, environ: dict[str, str], want: str
) -> None:
    path = tmp_path / "mlops-gpu.yaml"
    path.write_text(config_yaml(extra={"mlflow": {"tracking_uri": configured}}))
    cfg = load_config(path)
    assert cfg.tracking_uri(environ) == want.format(root=tmp_path.resolve())


# -- the starter config -------------------------------------------------------------------

TWO_TYPES = [
    StarterNode('we"ird\\name', "a100-80gb", None, 2),
    StarterNode("b", "l4-24gb", None, 1),
]
TWO_PROJECTS = {"projects": [("p1", 0, 0), ("p2", 1, 2)], "tracking_uri": "http://m:5000",
                "memory_gb": {"l4-24gb": 24.0}}  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "kwargs"),
    [
        ([StarterNode("host", "a100-80gb", None, 4)], {}),
        ([StarterNode("host", "h100-80gb", ["0", "3"], 2)], {"cohort": None}),
        (TWO_TYPES, TWO_PROJECTS),
    ],
    ids=["virtual-gpus", "real-devices-no-cohort", "two-types-two-projects"],
)
def test_starter_config_parses_and_has_the_nodes(
    nodes: list[StarterNode], kwargs: dict[str, Any]
) -> None:
    text = starter_config(nodes, source="a test", **kwargs)
    assert "#" in text
    cfg = parse_config(yaml.safe_load(text), "starter.yaml")
    got = [(n.name, n.gpu_type, n.devices) for n in cfg.model_nodes("local")]
    assert got == [(n.name, n.gpu_type, tuple(n.devices or map(str, range(n.gpus)))) for n in nodes]
    for pname, nominal, _ in kwargs.get("projects", [("default", 0, 0)]):
        for n in nodes:  # nominal 0 means "every GPU of the type"
            total = sum(m.gpus for m in nodes if m.gpu_type == n.gpu_type)
            assert cfg.projects[pname].quotas[n.gpu_type].nominal == (nominal or total)


@pytest.mark.parametrize("gpu_type", ["4090", "on"], ids=["numeric", "yaml-bool"])
def test_starter_config_quotes_gpu_type_names(gpu_type: str) -> None:
    text = starter_config([StarterNode("host", gpu_type, None, 2)], source="a test")
    cfg = parse_config(yaml.safe_load(text), "starter.yaml")
    assert list(cfg.gpu_types) == [gpu_type]


def test_init_writes_a_loadable_commented_config(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "mlops-gpu.yaml"
    proc = run_cli("init", "--virtual-gpus", "4", "--gpu-type", "a100-80gb", "--path", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "#" in path.read_text()
    cfg = load_config(path)
    (node,) = cfg.model_nodes("local")
    assert (node.gpu_type, node.devices) == ("a100-80gb", ("0", "1", "2", "3"))


@pytest.mark.parametrize(
    ("force", "rc", "overwritten"),
    [(False, 2, False), (True, 0, True)],
    ids=["refuses-without-force", "overwrites-with-force"],
)
def test_init_overwrite(tmp_path: Path, force: bool, rc: int, overwritten: bool) -> None:
    path = tmp_path / "mlops-gpu.yaml"
    path.write_text("# mine\n")
    proc = run_cli(
        "init", "--virtual-gpus", "2", "--path", str(path), *(["--force"] if force else [])
    )
    assert proc.returncode == rc
    assert (path.read_text() != "# mine\n") is overwritten
    if not force:
        (line,) = proc.stderr.splitlines()
        assert line.startswith("mlops-gpu: error:") and "--force" in line


# -- fuzzing ------------------------------------------------------------------------------


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path (dict keys and list indices) in ``node``."""
    if isinstance(node, list):
        node = dict(enumerate(node))
    if not isinstance(node, dict):
        return []
    return [p for k, v in node.items() for p in [(*prefix, k), *_paths(v, (*prefix, k))]]


FUZZ_BASE = yaml.safe_load(config_yaml(extra={"priority_classes": {"low": 0, "normal": 100}}))
# Keys and values may hold control characters, \n and \r included: messages stay one line.
one_line = st.text(st.characters(blacklist_categories=("Zl", "Zp")), max_size=8)
junk = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(), one_line,
                 st.lists(st.integers(), max_size=3),
                 st.dictionaries(one_line, st.integers(), max_size=2))  # fmt: skip
ops = st.sampled_from(["drop", "rename", "replace"])
edits = st.lists(st.tuples(st.sampled_from(_paths(FUZZ_BASE)), ops, junk, one_line), max_size=4)


def _apply(data: dict[str, Any], path: tuple[Any, ...], op: str, value: Any, name: str) -> None:
    parent: Any = data
    try:
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]]
    except (KeyError, IndexError, TypeError):  # an earlier edit removed or replaced it
        return
    if op == "drop":
        parent.pop(path[-1])
    elif op == "replace":
        parent[path[-1]] = value
    elif isinstance(parent, dict):  # rename
        parent[name] = parent.pop(path[-1])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits)
def test_fuzzed_config_is_a_config_or_a_one_line_config_error(
    changes: list[tuple[tuple[Any, ...], str, Any, str]],
) -> None:
    data = copy.deepcopy(FUZZ_BASE)
    for change in changes:
        _apply(data, *change)
    try:
        cfg = parse_config(data, "fuzz.yaml")
    except ConfigError as e:
        msg = str(e)
        assert msg.startswith("fuzz.yaml: ")
        assert "\n" not in msg and "\r" not in msg
    else:
        assert isinstance(cfg, Config)
