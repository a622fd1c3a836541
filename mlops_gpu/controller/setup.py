"""``mlops-gpu init``: a starter config from the GPUs NVML finds, or virtual GPUs."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from mlops_gpu.config.starter import StarterNode, starter_config
from mlops_gpu.telemetry import discover_gpus


def starter_nodes(
    virtual_gpus: int | None, gpu_type: str, nvml: Any | None = None
) -> tuple[list[StarterNode], str]:
    """Nodes for a starter config and a sentence saying where they came from (``nvml``: the
    telemetry seam, for tests)."""
    host = socket.gethostname()
    if virtual_gpus is None:
        found = discover_gpus(nvml)
        if found:
            by_type: dict[str, list[str]] = {}
            for g in found:
                by_type.setdefault(g.gpu_type, []).append(str(g.index))
            nodes = [
                StarterNode(host if len(by_type) == 1 else f"{host}-{t}", t, devs, len(devs))
                for t, devs in sorted(by_type.items())
            ]
            return nodes, f"found {len(found)} GPU(s) with NVML"
        virtual_gpus = 4
        why = "no NVIDIA driver found (NVML): using 4 virtual GPUs"
    else:
        why = f"using {virtual_gpus} virtual GPUs"
    return [StarterNode(host, gpu_type, None, virtual_gpus)], why


def write_starter(path: str, *, virtual_gpus: int | None, gpu_type: str, force: bool) -> str:
    target = Path(path)
    if target.exists() and not force:
        raise FileExistsError(f"{target}: already exists (use --force to overwrite)")
    if len(gpu_type) > 100:  # (the store keeps GPU type names in 100-character columns)
        raise ValueError(f"--gpu-type: a name of {len(gpu_type)} characters (at most 100)")
    nodes, why = starter_nodes(virtual_gpus, gpu_type)
    text = starter_config(nodes, source="mlops-gpu init", cohort=None)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return f"wrote {target} ({why}); edit projects and quotas, then `mlops-gpu submit`"
