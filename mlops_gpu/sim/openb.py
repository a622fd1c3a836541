"""The Alibaba "openb" GPU-sharing trace (FGD, ATC'23): its GPU nodes and its pods.

Nodes (``openb_node_list_gpu_node.csv``): ``sn, cpu_milli, memory_mib, gpu, model``. Each becomes
a shared-GPU ``Node`` of type ``model`` with ``gpu`` devices, its CPU and memory tracked.

Pods (``openb_pod_list_*.csv``): ``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` and
optionally ``gpu_spec`` (acceptable models, ``|``-separated), ``qos``, ``creation_time``,
``deletion_time`` (seconds). ``gpu_milli`` < 1000 is a share of one GPU (``num_gpu`` is then 1);
otherwise the pod takes ``num_gpu`` whole GPUs. Pods with ``num_gpu`` 0 need no GPU: they become
CPU-only runs (shape ``cpu``), which take CPU and memory on GPU nodes as they did in the trace.

Invariants: pods keep the file's order (creation order); every malformed row raises
``TraceError`` naming the file, the line and the column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from mlops_gpu.model import Node, ResourceRequest
from mlops_gpu.sim.trace import Trace, TraceError, TraceJob, _number, _rows

DATA = Path(__file__).resolve().parent / "data"
NODES_FILE = DATA / "openb_node_list_gpu_node.csv.gz"
POD_FILES = {
    "default": DATA / "openb_pod_list_default.csv.gz",
    "gpuspec33": DATA / "openb_pod_list_gpuspec33.csv.gz",
}
BACKEND = "sim"


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    qos: str = ""
    creation_s: float = 0.0
    deletion_s: float | None = None

    @property
    def fractional(self) -> bool:
        return self.num_gpu > 0 and self.gpu_milli < 1000

    @property
    def devices_needed(self) -> int:
        return 1 if self.fractional else self.num_gpu

    @property
    def share(self) -> float:
        """The share of each device taken (0 for a CPU-only pod)."""
        if self.num_gpu == 0:
            return 0.0
        return self.gpu_milli / 1000 if self.fractional else 1.0

    @property
    def gpu_demand(self) -> float:
        """GPUs asked for: the share of one GPU, whole GPUs, or 0."""
        return self.share * self.devices_needed

    def request(self) -> ResourceRequest:
        frac = self.gpu_milli / 1000 if self.fractional else None
        return ResourceRequest(
            gpus=1 if frac is not None else self.num_gpu,
            gpu_types=self.gpu_spec,
            gpu_fraction=frac,
            cpu_milli=self.cpu_milli,
            host_memory_mb=self.memory_mib,
        )


@dataclass(frozen=True)
class OpenbPods:
    file: str
    pods: tuple[Pod, ...]  # in file order, CPU-only pods included
    cpu_only: int


def load_nodes(path: str | Path = NODES_FILE) -> tuple[Node, ...]:
    p = Path(path)
    out = []
    for line, row in _rows(p, {"sn", "cpu_milli", "memory_mib", "gpu", "model"}):
        gpus = int(_number(p, line, row, "gpu", integer=True))
        model = (row.get("model") or "").strip()
        if gpus < 1 or not model:
            raise TraceError(f"{p}:{line}: a GPU node needs gpu >= 1 and a model, got {row}")
        out.append(
            Node(
                name=row["sn"].strip(),
                backend=BACKEND,
                gpu_type=model,
                devices=tuple(str(i) for i in range(gpus)),
                shared=True,
                cpu_milli=int(_number(p, line, row, "cpu_milli", integer=True)),
                host_memory_mb=int(_number(p, line, row, "memory_mib", integer=True)),
            )
        )
    if not out:
        raise TraceError(f"{p}: no nodes")
    return tuple(out)


def load_pods(path: str | Path) -> OpenbPods:
    p = Path(path)
    pods, cpu_only = [], 0
    required = {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}
    for line, row in _rows(p, required):
        num_gpu = int(_number(p, line, row, "num_gpu", integer=True))
        milli = int(_number(p, line, row, "gpu_milli", integer=True))
        if num_gpu == 0:
            cpu_only += 1
            milli = 0
        elif milli > 1000 or milli == 0:
            raise TraceError(f"{p}:{line}: column gpu_milli: expected 1..1000, got {milli}")
        if 0 < milli < 1000 and num_gpu != 1:
            raise TraceError(
                f"{p}:{line}: column num_gpu: a fractional GPU (gpu_milli {milli}) needs "
                f"num_gpu 1, got {num_gpu}"
            )
        spec = tuple(s for s in (row.get("gpu_spec") or "").strip().split("|") if s)
        deletion = (row.get("deletion_time") or "").strip()
        pods.append(
            Pod(
                name=row["name"].strip(),
                cpu_milli=int(_number(p, line, row, "cpu_milli", integer=True)),
                memory_mib=int(_number(p, line, row, "memory_mib", integer=True)),
                num_gpu=num_gpu,
                gpu_milli=milli,
                gpu_spec=spec,
                qos=(row.get("qos") or "").strip(),
                creation_s=_number(p, line, row, "creation_time") if "creation_time" in row else 0,
                deletion_s=_number(p, line, row, "deletion_time") if deletion else None,
            )
        )
    return OpenbPods(p.name, tuple(pods), cpu_only)


def load_openb(
    pods_path: str | Path = POD_FILES["default"],
    nodes_path: str | Path = NODES_FILE,
    start_day: float = 0.0,
    days: float | None = None,
) -> Trace:
    """The openb pods created in [``start_day``, ``start_day`` + ``days``) (days from the
    trace's start; all by default) as simulator jobs on the trace's own nodes. A pod runs from
    creation to deletion; one without a deletion time is left out. Projects are the pods' QoS
    classes (LS, BE, ...), weighted by their GPU demand."""
    pods = load_pods(pods_path)
    lo = start_day * 86400
    hi = float("inf") if days is None else lo + days * 86400
    jobs = []
    weights: dict[str, float] = {}
    for pod in pods.pods:
        if pod.deletion_s is None or not lo <= pod.creation_s < hi:
            continue
        project = pod.qos or "default"
        jobs.append(
            TraceJob(
                id=pod.name,
                submit_s=pod.creation_s - lo,
                duration_s=max(pod.deletion_s - pod.creation_s, 1.0),
                gpus=pod.request().gpus,
                nodes=1,
                project=project,
                gpu_fraction=pod.request().gpu_fraction,
                gpu_types=pod.gpu_spec,
                cpu_milli=pod.cpu_milli,
                host_memory_mb=pod.memory_mib,
            )
        )
        weights[project] = weights.get(project, 0.0) + pod.gpu_demand
    if not jobs:
        raise TraceError(f"{pods_path}: no pods created in the window [{lo:.0f}, {hi:.0f}) s")
    nodes = load_nodes(nodes_path)
    name = f"openb {pods.file}"
    return Trace(
        name,
        tuple(sorted(jobs, key=lambda j: (j.submit_s, j.id))),
        dict(MappingProxyType(weights)),
        nodes,
    )
