"""Builders for tests (runs, nodes, projects, snapshots, configs): small, explicit defaults so
a test states only what matters to it."""

from mlops_gpu.testing.builders import (
    config_yaml,
    make_node,
    make_project,
    make_run,
    make_snapshot,
    make_spec,
)

__all__ = ["config_yaml", "make_node", "make_project", "make_run", "make_snapshot", "make_spec"]
