"""The example notebook (``examples/notebook.ipynb``) run top to bottom in a real kernel in
remote mode: ``MLOPS_GPU_URL`` and ``MLOPS_GPU_TOKEN`` name a real ``mlops-gpu server`` with
the notebook's projects; the commands, the callable and the sweep run there under the token's
user, the MLflow run is read from the server's tracking store, and the notebook's side keeps no
state of its own (it never opens a store)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from mlops_gpu.testing import config_yaml
from team.conftest import Server, no_5xx

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


@pytest.mark.slow
def test_the_example_notebook_runs_against_a_server(
    make_server: Callable[..., Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient

    projects = yaml.safe_load(config_yaml(projects={"vision": (2, 2), "nlp": (2, 2)}))
    srv = make_server(
        None,
        extra={"projects": projects["projects"], "scheduler": {"tick_s": 0.2},
               "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}},
        users={"nb": (False, {"vision": "member", "nlp": "member"})},
    )  # fmt: skip
    home = tmp_path / "laptop"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MLOPS_GPU_NOTEBOOK_DIR", str(home / "demo"))
    monkeypatch.setenv("MLOPS_GPU_URL", srv.url)
    monkeypatch.setenv("MLOPS_GPU_TOKEN", srv.tokens["nb"])
    monkeypatch.setenv("MLOPS_GPU_USER", "root")  # ignored in remote mode
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLOPS_GPU_CONFIG", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(home)}})  # fmt: skip
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "succeeded - result:" in text and "best" in text and "MLflow run" in text
    assert str(tmp_path / "mlflow.db") in text  # the server's tracking store
    # nothing of a store on the notebook's side: no state folder, no starter config
    assert not (home / "demo" / "state").exists()
    assert not (home / ".config" / "mlops-gpu").exists()
    with srv.client("nb") as c:
        runs = c.get("/api/v1/runs", params={"limit": 1000}).json()["runs"]
    assert len(runs) >= 2 + 3 + 6 and {r["user"] for r in runs} == {"nb"}
    no_5xx(srv)
