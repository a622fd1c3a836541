"""Capacity: GPU types (flavors with a price), nodes offering GPUs, and placements on them.

A node offers whole GPUs of exactly one type, named by device ids (NVML indices such as ``"0"``,
MIG or GPU UUIDs, or virtual ids). A placement is one ``NodeSlot`` per node of the run's gang; each
slot lists the device ids the run holds there, so two placements on one node are disjoint exactly
when their device id sets are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_EMPTY: Mapping[str, str] = MappingProxyType({})
_EMPTY_MIG: Mapping[str, tuple[str, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    price_per_hour: float = 0.0
    memory_gb: float | None = None


@dataclass(frozen=True, slots=True)
class Node:
    """One schedulable host (or virtual host) of one backend."""

    name: str
    backend: str
    gpu_type: str
    devices: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    schedulable: bool = True
    #: Free-text why the node is not schedulable (drained, down, cordoned).
    state_reason: str = ""
    #: MIG slices offered, by profile (``"1g.10gb"`` -> slice UUIDs). GPUs split into MIG
    #: slices are not listed in ``devices``.
    mig: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY_MIG)
    #: Whether ``devices`` may be shared by fractional or memory-capped runs (time-slicing).
    shared: bool = False
    #: Memory of one device, for memory-capped shared requests.
    gpu_memory_mb: int | None = None
    #: Host CPU (millicores) and memory the node offers runs; None: not tracked (any run's
    #: CPU and memory requests fit).
    cpu_milli: int | None = None
    host_memory_mb: int | None = None

    @property
    def capacity(self) -> int:
        return len(self.devices)


def mig_share(profile: str) -> float:
    """The share of a GPU one MIG slice is charged as: ``"3g.40gb"`` -> 3/7 (A100/H100 have
    seven compute slices)."""
    head = profile.split("g.", 1)[0]
    return int(head) / 7 if head.isdigit() else 1.0


@dataclass(frozen=True, slots=True)
class NodeSlot:
    node: str
    devices: tuple[str, ...]
    #: The share of each device held: 1.0 for whole GPUs, the fraction for shared GPUs, the
    #: slice's share for MIG (``mig_share``).
    fraction: float = 1.0
    #: Memory cap on a shared device, if the run asked for one.
    memory_mb: int | None = None
    #: Host CPU (millicores) and memory held on this node (the request's, per gang member).
    cpu_milli: int = 0
    host_memory_mb: int = 0

    @property
    def amount(self) -> float:
        return len(self.devices) * self.fraction


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an admitted run runs: one backend, one GPU type, one slot per gang member."""

    backend: str
    gpu_type: str
    slots: tuple[NodeSlot, ...]

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.slots)

    @property
    def total_gpus(self) -> int:
        """Devices held (whole, shared or MIG slices), counted once each."""
        return sum(len(s.devices) for s in self.slots)

    @property
    def gpu_amount(self) -> float:
        """GPUs charged to quota and cost: whole GPUs count 1, shares and slices their part."""
        return sum(s.amount for s in self.slots)

    def to_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "gpu_type": self.gpu_type,
            "slots": [
                {
                    "node": s.node,
                    "devices": list(s.devices),
                    "fraction": s.fraction,
                    "memory_mb": s.memory_mb,
                    "cpu_milli": s.cpu_milli,
                    "host_memory_mb": s.host_memory_mb,
                }
                for s in self.slots
            ],
        }

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> Placement:
        slots_raw = d["slots"]
        assert isinstance(slots_raw, list)
        return Placement(
            backend=str(d["backend"]),
            gpu_type=str(d["gpu_type"]),
            slots=tuple(
                NodeSlot(
                    node=str(s["node"]),
                    devices=tuple(str(x) for x in s["devices"]),
                    fraction=float(s.get("fraction", 1.0)),
                    memory_mb=s.get("memory_mb"),
                    cpu_milli=int(s.get("cpu_milli", 0)),
                    host_memory_mb=int(s.get("host_memory_mb", 0)),
                )
                for s in slots_raw
            ),
        )


@dataclass(frozen=True, slots=True)
class BackendCapabilities:
    """What a backend can host; the core never places a run where these say no."""

    multi_node: bool = False
    mig: bool = False
    shared_gpus: bool = False
    checkpoint_signal: bool = True
    #: For the controller, not the core. Each launch is a slow round trip to a cluster's
    #: controller (sbatch, the Kubernetes API): a tick's launches run several at once.
    parallel_launch: bool = False
    #: A launched job usually runs at once (a local process): the controller polls right after
    #: launching, so the run shows running in the same tick. False where starting takes
    #: seconds (a pod): the next tick's poll sees it.
    starts_at_once: bool = True
