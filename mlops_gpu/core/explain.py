"""Sentences for people: what a run needs, in words."""

from __future__ import annotations

from mlops_gpu.model import Run


def shape_text(run: Run, gpu_types: list[str]) -> str:
    req = run.request
    types = " or ".join(gpu_types) if gpu_types else "GPUs (no type in this cluster)"
    if req.shape == "mig":
        return f"needs {req.gpus} MIG {req.mig} slice(s) of {types}"
    if req.shape == "shared":
        parts = [
            f"{req.gpu_fraction:g} of a GPU" if req.gpu_fraction else "",
            f"{req.gpu_memory_mb} MB" if req.gpu_memory_mb else "",
        ]
        return f"needs {' with '.join(p for p in parts if p)} of a shared {types}"
    where = "on one node" if req.nodes == 1 else f"on each of {req.nodes} nodes"
    return f"needs {req.gpus} {types} {where}"
