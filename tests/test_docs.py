"""The docs say what the code does: the README's first steps work on the starter config, the
plugins' README names what pyproject registers, and the retry rule reads the same everywhere."""

from __future__ import annotations

import re
from importlib.metadata import distribution
from pathlib import Path

import pytest
import yaml

from mlops_gpu.config.starter import starter_config

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    """The README's text from heading ``title`` up to the next heading of the same or a higher
    level."""
    m = re.search(rf"^(#+) {re.escape(title)}\s*$", README, re.M)
    assert m, f"README has no section {title!r}"
    level = len(m.group(1))
    rest = README[m.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


@pytest.mark.parametrize(
    "title", ["Quick start on your own machine", "From Python or a notebook"], ids=["cli", "sdk"]
)
def test_first_steps_use_projects_the_starter_config_has(title: str) -> None:
    """A newcomer copies these steps onto `mlops-gpu init`'s config: every project they name
    must be in it (the SDK example named `vision`, which the starter lacks)."""
    text = section(title)
    named = set(re.findall(r"""project\s*=\s*["']([^"']+)["']""", text))
    named |= set(re.findall(r"--project[ =]([\w.-]+)", text))
    assert named, "the section names no project"
    projects = set(yaml.safe_load(starter_config([], source="test"))["projects"])
    assert named <= projects, f"{sorted(named - projects)} not in the starter config {projects}"


def test_plugins_readme_names_every_registered_plugin() -> None:
    text = (ROOT / "plugins" / "README.md").read_text()
    assert "to come" not in text.lower()
    eps = [ep for ep in distribution("mlops-gpu").entry_points if ep.group != "console_scripts"]
    assert eps
    for ep in eps:
        assert f"`{ep.group}`" in text, ep.group
        assert ep.name in text and ep.module in text, ep


def test_retry_docs_agree_that_preemptions_do_not_use_up_attempts() -> None:
    """README's config table, the starter config's comment and the store agree (the starter
    said a preempted run is retried until it has had max_attempts attempts);
    tests/test_store.py::test_preemptions_do_not_use_up_retries checks the behaviour."""
    readme_row = next(line for line in README.splitlines() if line.startswith("| `retry` |"))
    assert "preemptions do not count" in readme_row
    starter = starter_config([], source="test")
    comment = starter[starter.index("retry:") : starter.index("max_attempts:")]
    assert "preemptions" in comment and "do not count" in comment
    assert "preempted or lost run is retried" not in starter
