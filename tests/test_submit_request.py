"""One builder for every edge's run spec (``model.submit``): the CLI's flags, the SDK's keywords
and the Prefect worker's job variables, given the same request, give the same ``SubmitRequest``,
hence the same spec (``run_spec``) and the same REST body; the builder's defaults and its
refusal of an unknown signal, worded as each edge's own field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mlops_gpu.cli.submit_cmd import submit_request as cli_request
from mlops_gpu.model.submit import SubmitFieldError, SubmitRequest, run_spec, signal_name
from mlops_gpu.sdk.run import submit_request as sdk_request

ARGV = ("python", "train.py", "--lr", "0.1")


def _three(**same: Any) -> list[SubmitRequest]:
    """The request of each edge for the same ask (``same``: the SDK's keywords)."""
    from mlops_gpu_prefect.worker import MlopsGpuJobConfiguration, submit_keywords

    sdk = sdk_request(ARGV, **same)
    types = same.get("gpu_type") or ()
    cli = cli_request(
        ARGV, project=same["project"], name=same.get("name"), gpus=same.get("gpus", 1),
        nodes=same.get("nodes", 1), gpu_types=tuple(types),
        cpu_milli=same.get("cpu_milli", 0), host_memory_mb=same.get("host_memory_mb", 0),
        priority=same.get("priority"), experiment=same.get("experiment"),
        backend=same.get("backend"), workdir=same.get("workdir"),
        max_runtime=f"{same['max_runtime']:g}s" if same.get("max_runtime") else None,
        env=tuple(f"{k}={v}" for k, v in same.get("env", {}).items()),
    )  # fmt: skip
    conf = MlopsGpuJobConfiguration(
        project=same["project"], gpus=same.get("gpus", 1), nodes=same.get("nodes", 1),
        gpu_type=",".join(types) or None, priority=same.get("priority"),
        max_runtime=same.get("max_runtime"), backend=same.get("backend"),
        experiment=same.get("experiment"), cpu=same.get("cpu_milli", 0),
        memory=same.get("host_memory_mb", 0), command=" ".join(ARGV), env=same.get("env", {}),
        name=same.get("name"),
    )  # fmt: skip
    argv, keywords = submit_keywords(conf, "flow-run-name")
    keywords.pop("config")
    # the worker has no workdir variable: locally its runs start in its own folder
    assert keywords["workdir"] == os.getcwd()
    keywords["workdir"] = same.get("workdir")
    assert argv == list(ARGV)  # (a ``prefect ...`` command would run under this interpreter)
    return [sdk, cli, sdk_request(tuple(argv), **keywords)]


@pytest.mark.parametrize(
    "same",
    [
        {"project": "vision", "name": "resnet"},
        {"project": "nlp", "name": "big", "gpus": 8, "nodes": 2, "gpu_type": ["h100-80gb"],
         "priority": "high", "max_runtime": 7200.0, "experiment": "llm", "backend": "slurm",
         "env": {"SEED": "1"}, "workdir": "/srv/jobs"},
        {"project": "etl", "name": "cpu", "gpus": 0, "cpu_milli": 2000, "host_memory_mb": 512,
         "gpu_type": ["a100-80gb", "h100-80gb"]},
    ],
    ids=["defaults", "gang-pinned", "cpu-only-two-types"],
)  # fmt: skip
def test_the_three_edges_build_the_same_spec(same: dict[str, Any]) -> None:
    sdk, cli, prefect = _three(**same)
    assert sdk == cli == prefect
    specs = [run_spec(r, user="ann", default_priority="normal", cwd="/home/ann") for r in
             (sdk, cli, prefect)]  # fmt: skip
    assert specs[0] == specs[1] == specs[2]
    assert sdk.body() == cli.body() == prefect.body()


def test_run_spec_fills_the_defaults() -> None:
    long = tuple(f"arg{i}" for i in range(40))
    spec = run_spec(SubmitRequest(project="p", command=long, workdir="sub/../jobs"),
                    user="ann", default_priority="normal", cwd="/home/ann")  # fmt: skip
    assert spec.name == " ".join(long)[:80] and len(spec.name) == 80
    assert (spec.user, spec.priority, spec.workdir) == ("ann", "normal", "/home/ann/jobs")
    assert run_spec(SubmitRequest(project="p", command=("x",)), user="ann",
                    default_priority="low", cwd="/w").workdir == "/w"  # fmt: skip
    assert (spec.checkpoint.signal, spec.checkpoint.grace_s) == ("SIGTERM", 30.0)


@pytest.mark.parametrize(
    "given,full", [("TERM", "SIGTERM"), ("sigusr1", "SIGUSR1"), ("SIGINT", "SIGINT")],
    ids=["short", "lower", "full"],
)  # fmt: skip
def test_a_signal_is_named_in_full(given: str, full: str) -> None:
    assert signal_name(given) == full
    assert SubmitRequest(project="p", signal=given).signal == full


def test_an_unknown_signal_is_refused_in_each_edges_words() -> None:
    from mlops_gpu.controller import SubmitError

    with pytest.raises(SubmitFieldError, match=r"^unknown signal 'BOGUS'$") as e:
        SubmitRequest(project="p", signal="BOGUS")
    assert e.value.field == "signal"
    with pytest.raises(SubmitError, match=r"^signal: unknown signal 'BOGUS'$"):
        sdk_request(ARGV, project="p", signal="BOGUS")
    with pytest.raises(SubmitFieldError):
        cli_request(ARGV, project="p", stop_signal="BOGUS")


def test_the_body_is_what_the_server_accepts(tmp_path: Path) -> None:
    """Every field of the request reaches the server under the REST API's own name."""
    from mlops_gpu.server.schemas import SubmitBody

    req = sdk_request(ARGV, project="p", gpus=2, gpu_type="a100-80gb", env={"A": "1"},
                      max_runtime=60.0, signal="USR1", grace=5, workdir=str(tmp_path))  # fmt: skip
    body = SubmitBody.model_validate({"command": list(ARGV), **req.body()})
    assert {k: getattr(body, k) for k in req.body()} == req.body()
    assert set(req.body()) | {"command"} <= set(SubmitBody.model_fields)
