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
    host = [
        f"{req.cpu_milli}m CPU" if req.cpu_milli else "",
        f"{req.host_memory_mb} MB memory" if req.host_memory_mb else "",
    ]
    host_text = " and ".join(h for h in host if h)
    if req.shape == "cpu":
        return f"needs {host_text} on one node (no GPU)"
    where = "on one node" if req.nodes == 1 else f"on each of {req.nodes} nodes"
    return f"needs {req.gpus} {types} {where}" + (f", with {host_text}" if host_text else "")
