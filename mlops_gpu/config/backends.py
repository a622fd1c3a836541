"""The backend sections of the config: ``BackendConfigBase`` and the built-in backends' models.

A backend type is one model class: a subclass of ``BackendConfigBase`` whose ``type`` field is a
``Literal`` of its name, registered under that name in the ``mlops_gpu.backends`` entry point
group (``config.registry``). Its ``builder`` names, as ``"module:function"``, the function that
makes the running backend from the config: ``function(cfg: Config, name: str) -> Backend``.

Invariants:
- A model is pure data: importing this module (or a plugin's model) imports no backend and no
  SDK; the builder's module is imported only when a backend is made (``controller.backend_build``
  for the built-ins, where ``kubernetes`` and the Slurm tools stay lazy).
- ``config_nodes()`` are the nodes the file lists (none for backends whose nodes come from the
  cluster at run time); ``host_folders()`` the folders on this host its runs write to.
- Imports only pydantic and ``config.base``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from mlops_gpu.config.base import NodeConfig, Strict

if TYPE_CHECKING:
    from mlops_gpu.config.schema import Config


class BackendConfigBase(Strict):
    """The base of every backend section: subclasses set ``type: Literal["<name>"]``."""

    #: ``"module:function"`` making the backend: ``function(cfg: Config, name: str) -> Backend``.
    builder: ClassVar[str] = ""
    type: str

    def config_nodes(self) -> list[NodeConfig]:
        """The nodes this section lists (none where the cluster reports them at run time)."""
        return []

    def host_folders(self, cfg: Config, name: str) -> list[Path]:
        """Folders on this host the backend's runs write to (made and checked at submit)."""
        return []


class LocalBackendConfig(BackendConfigBase):
    """Processes on this host, on the GPUs its nodes list."""

    builder: ClassVar[str] = "mlops_gpu.controller.backend_build:local"
    type: Literal["local"] = "local"
    nodes: list[NodeConfig] = Field(min_length=1)

    def config_nodes(self) -> list[NodeConfig]:
        return self.nodes

    def host_folders(self, cfg: Config, name: str) -> list[Path]:
        return [cfg.state_path / "runs", cfg.state_path / "checkpoints"]


class FakeBackendConfig(BackendConfigBase):
    """Simulated jobs on the nodes listed (each ends after ``duration_s``)."""

    builder: ClassVar[str] = "mlops_gpu.controller.backend_build:fake"
    type: Literal["fake"]
    nodes: list[NodeConfig] = Field(min_length=1)
    duration_s: float = Field(1.0, ge=0)

    def config_nodes(self) -> list[NodeConfig]:
        return self.nodes


class SlurmBackendConfig(BackendConfigBase):
    """A Slurm cluster reached with its command-line tools (``sinfo``, ``sbatch``, ``squeue``,
    ``scontrol``, ``scancel``, ``sacct -c``); nodes come from ``sinfo``."""

    builder: ClassVar[str] = "mlops_gpu.controller.backend_build:slurm"
    type: Literal["slurm"]
    #: The cluster's name in run handles (``slurm:<cluster>:<jobid>``).
    cluster: str = Field("slurm", pattern=r"^[A-Za-z0-9_.-]+$")
    partition: str | None = None
    account: str | None = None
    #: Our GPU type name -> the cluster's GRES type (``a100-80gb: a100``); a GRES type with no
    #: entry here is taken as the GPU type of that name.
    gres_types: dict[str, str] = Field(default_factory=dict)
    #: ``SLURM_CONF`` for the tools (default: theirs).
    slurm_conf: str | None = None
    #: Folder on storage the compute nodes share: job scripts, logs, checkpoints, telemetry
    #: (default: ``<state_dir>/slurm/<backend name>``).
    shared_dir: str | None = None
    #: The Python that runs ``mlops-gpu exec`` on the compute nodes (default: the scheduler's).
    python: str | None = None
    #: Seconds an inventory (``sinfo``) is reused before it is read again.
    inventory_s: float = Field(10.0, ge=0)
    #: Seconds a Slurm command may take before it counts as failed.
    command_timeout_s: float = Field(30.0, gt=0)
    #: Node labels, by node name (e.g. ``{sn1: {rack: r1}}``), for topology-aware placement.
    labels: dict[str, dict[str, str]] = Field(default_factory=dict)

    @property
    def nodes(self) -> list[NodeConfig]:
        return []  # from sinfo, at run time

    def shared_path(self, cfg: Config, name: str) -> Path:
        """The shared folder: ``shared_dir``, else ``<state_dir>/slurm/<backend name>``."""
        return (
            cfg.resolve_path(self.shared_dir)
            if self.shared_dir
            else cfg.state_path / "slurm" / name
        )

    def host_folders(self, cfg: Config, name: str) -> list[Path]:
        return [self.shared_path(cfg, name)]


class KubernetesBackendConfig(BackendConfigBase):
    """A Kubernetes cluster reached with the official client; nodes come from the API."""

    builder: ClassVar[str] = "mlops_gpu.controller.backend_build:kubernetes"
    type: Literal["kubernetes"]
    #: Kubeconfig file and context (default: the client's own lookup and current context).
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str = "default"
    #: The image runs' pods start (it needs Python and mlops-gpu for the launcher).
    image: str = "python:3.11-slim"
    python: str = "python3"
    service_account: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    #: Kubernetes ``volumes`` and container ``volumeMounts``, passed through as given.
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list)
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    #: Node label ``nvidia.com/gpu.product`` value -> our GPU type.
    gpu_models: dict[str, str] = Field(default_factory=dict)
    inventory_s: float = Field(10.0, ge=0)
    #: The API client's rate limit, as client-go's ``--kube-api-qps``/``--kube-api-burst``
    #: (the defaults are kube-scheduler's).
    api_qps: float = Field(50.0, gt=0)
    api_burst: int = Field(100, ge=1)
    #: Where runs' pods see their checkpoint folder (mount shared storage there).
    checkpoint_dir: str = "/tmp/mlops-gpu-checkpoints"

    @property
    def nodes(self) -> list[NodeConfig]:
        return []  # from the API, at run time
