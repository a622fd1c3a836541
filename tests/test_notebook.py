"""The example notebook (``examples/notebook.ipynb``) runs top to bottom in a real kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import stop_scheduler

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebook.ipynb"


@pytest.mark.slow
def test_the_example_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("MLOPS_GPU_NOTEBOOK_DIR", str(tmp_path / "demo"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})  # fmt: skip
    try:
        client.execute()
    finally:
        cfg = tmp_path / "demo" / "mlops-gpu.yaml"
        if cfg.exists():
            stop_scheduler(cfg)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "succeeded - result:" in text and "best" in text and "MLflow run" in text
    assert os.path.exists(tmp_path / "demo" / "state")
