"""Slurm power saving read as pool node states (``backends.slurm_power``), from ``sinfo --json``
captured on the repo's cloud-node test cluster (``scripts/slurm.sh`` with
``MLOPS_GPU_SLURM_CLOUD=4``): sc1 and sc2 booting for a job each, sc3 and sc4 powered down; then
sc1 up and sc2 down after its resume failed (``ResumeTimeout reached``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlops_gpu.backends.slurm_parse import parse_sinfo
from mlops_gpu.backends.slurm_power import power_managed, power_state
from mlops_gpu.model import NodeState

DATA = Path(__file__).with_name("data")


def nodes(name: str) -> dict[str, tuple[NodeState | None, bool, bool, str]]:
    """node -> (pool state, power-managed, schedulable, reason)."""
    doc = json.loads((DATA / name).read_text())
    return {
        n.name: (power_state(n.words), power_managed(n.words), n.schedulable, n.reason)
        for n in parse_sinfo(doc)
    }


def test_booting_nodes_take_runs_and_powered_down_ones_do_not() -> None:
    got = nodes("sinfo-power-booting-22.05.json")
    assert got["sc1"] == (NodeState.BOOTING, True, True, "")  # NOT_RESPONDING while it boots
    assert got["sc2"] == (NodeState.BOOTING, True, True, "")
    assert got["sc3"] == (NodeState.POWERED_DOWN, True, False, "powered_down")
    assert got["sn1"] == (NodeState.UP, False, True, "")  # a static node: no pool's


def test_a_node_up_keeps_cloud_and_one_whose_resume_failed_leaves_the_pool() -> None:
    got = nodes("sinfo-power-later-22.05.json")
    assert got["sc1"] == (NodeState.UP, True, True, "")
    state, managed, schedulable, reason = got["sc2"]
    assert (state, managed, schedulable) == (None, True, False)
    assert reason.endswith("ResumeTimeout reached") and "down" in reason


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ({"IDLE", "POWERING_DOWN"}, NodeState.POWERED_DOWN),
        ({"IDLE", "POWER_DOWN"}, NodeState.POWERED_DOWN),
        ({"MIXED", "DRAIN", "CLOUD"}, NodeState.DRAINING),
        ({"IDLE", "FAIL", "POWERED_DOWN"}, None),
        ({"ALLOCATED", "CLOUD"}, NodeState.UP),
    ],
)
def test_state_words_map_to_pool_states(words: set[str], expected: NodeState | None) -> None:
    assert power_state(words) is expected
