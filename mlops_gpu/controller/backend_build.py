"""The built-in backends' builders: ``function(cfg, name) -> Backend`` from a validated config.

Each backend model in ``config.backends`` names its builder here by ``"module:function"``;
``make_backend`` imports that module only when a backend of the type is made, so a config
naming no Kubernetes backend never imports the ``kubernetes`` client (nor a plugin's SDK).

Invariants:
- A builder reads only its own section (``cfg.backends[name]``) and the config's paths.
- ``make_backend`` checks that what a builder returns has the ``Backend`` methods, and says
  which builder broke the contract when it does not.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

from mlops_gpu.backends import Backend
from mlops_gpu.config import (
    BackendConfigBase,
    Config,
    FakeBackendConfig,
    KubernetesBackendConfig,
    SlurmBackendConfig,
)

_METHODS = ("inventory", "launch", "poll", "cancel", "find")


def make_backend(cfg: Config, name: str) -> Backend:
    """The backend ``name`` of ``cfg``, made by its type's builder."""
    section: BackendConfigBase = cfg.backends[name]
    module, _, attr = section.builder.partition(":")
    try:
        fn: Any = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise RuntimeError(
            f"backends.{name}: the builder {section.builder!r} of backend type"
            f" {section.type!r} cannot be imported: {e}"
        ) from e
    backend = fn(cfg, name)
    missing = [m for m in _METHODS if not callable(getattr(backend, m, None))]
    if missing:
        raise RuntimeError(
            f"backends.{name}: the builder {section.builder!r} returned {type(backend).__name__},"
            f" which lacks the Backend method(s) {', '.join(missing)}"
        )
    return cast(Backend, backend)


def local(cfg: Config, name: str) -> Backend:
    from mlops_gpu.backends.local import LocalBackend

    return LocalBackend(name, cfg.model_nodes(name), cfg.state_path)


def fake(cfg: Config, name: str) -> Backend:
    from mlops_gpu.backends.fake import FakeBackend

    b = cfg.backends[name]
    assert isinstance(b, FakeBackendConfig)
    return FakeBackend(name, cfg.model_nodes(name), default_duration_s=b.duration_s)


def slurm(cfg: Config, name: str) -> Backend:
    from mlops_gpu.backends.slurm import SlurmBackend

    b = cfg.backends[name]
    assert isinstance(b, SlurmBackendConfig)
    return SlurmBackend(
        name,
        b.shared_path(cfg, name),
        cluster=b.cluster,
        partition=b.partition,
        account=b.account,
        gres_types=b.gres_types,
        slurm_conf=str(cfg.resolve_path(b.slurm_conf)) if b.slurm_conf else None,
        python=b.python,
        inventory_s=b.inventory_s,
        timeout_s=b.command_timeout_s,
        labels=b.labels,
    )


def kubernetes(cfg: Config, name: str) -> Backend:
    from mlops_gpu.backends.k8s import KubernetesBackend
    from mlops_gpu.backends.k8s_manifest import PodSettings

    b = cfg.backends[name]
    assert isinstance(b, KubernetesBackendConfig)
    pod = PodSettings(
        namespace=b.namespace,
        image=b.image,
        python=b.python,
        service_account=b.service_account,
        env=b.env,
        volumes=tuple(b.volumes),
        volume_mounts=tuple(b.volume_mounts),
        annotations=b.pod_annotations,
    )
    return KubernetesBackend(
        name,
        kubeconfig=str(cfg.resolve_path(b.kubeconfig)) if b.kubeconfig else None,
        context=b.context,
        pod=pod,
        gpu_models=b.gpu_models,
        inventory_s=b.inventory_s,
        checkpoint_dir=b.checkpoint_dir,
        api_qps=b.api_qps,
        api_burst=b.api_burst,
    )
