"""``Runtime``: a validated config with its store and backends, and the submit path every edge
(CLI, SDK, plugins) shares."""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from mlops_gpu.backends import Backend
from mlops_gpu.backends.fake import FakeBackend
from mlops_gpu.backends.local import LocalBackend
from mlops_gpu.config import (
    Config,
    FakeBackendConfig,
    KubernetesBackendConfig,
    LocalBackendConfig,
    SlurmBackendConfig,
    load_config,
)
from mlops_gpu.core import request_problems
from mlops_gpu.model import Node, ResourceRequest, Run, RunSpec
from mlops_gpu.model.submit import NAME_FROM_COMMAND, SubmitRequest, run_spec
from mlops_gpu.state import Store
from mlops_gpu.state.errors import DependencyError
from mlops_gpu.state.jobs import JobControl


class SubmitError(ValueError):
    """A run that cannot be queued; nothing was written."""


def build_backend(cfg: Config, name: str) -> Backend:
    b = cfg.backends[name]
    nodes = cfg.model_nodes(name)
    if isinstance(b, LocalBackendConfig):
        return LocalBackend(name, nodes, cfg.state_path)
    if isinstance(b, FakeBackendConfig):
        return FakeBackend(name, nodes, default_duration_s=b.duration_s)
    if isinstance(b, SlurmBackendConfig):
        from mlops_gpu.backends.slurm import SlurmBackend

        shared = cfg.resolve_path(b.shared_dir) if b.shared_dir else cfg.state_path / "slurm" / name
        return SlurmBackend(
            name,
            shared,
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
    if isinstance(b, KubernetesBackendConfig):
        from mlops_gpu.backends.k8s import KubernetesBackend
        from mlops_gpu.backends.k8s_manifest import PodSettings

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
    raise AssertionError(f"unhandled backend type {type(b).__name__}")  # pragma: no cover


class Runtime:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    @staticmethod
    def load(path: str | os.PathLike[str] | None = None) -> Runtime:
        return Runtime(load_config(path))

    @cached_property
    def store(self) -> Store:
        # A missing SQLite file (and its folder) is created; anything else at the path is
        # checked first, and a store that cannot be used is a one-line StoreError.
        return Store(self.cfg.store_url, config=self.cfg.source)

    @cached_property
    def backends(self) -> Mapping[str, Backend]:
        return {name: build_backend(self.cfg, name) for name in self.cfg.backends}

    def nodes(self) -> list[Node]:
        return [n for b in self.backends.values() for n in b.inventory()]

    def problems(self, spec: RunSpec, nodes: list[Node] | None = None) -> list[str]:
        """What is wrong with ``spec`` for this config and inventory (``nodes``: the
        inventory, when the caller has read it already)."""
        return request_problems(
            spec,
            projects=self.cfg.model_projects(),
            gpu_types=self.cfg.model_gpu_types(),
            priority_classes=self.cfg.priority_classes,
            nodes=self.nodes() if nodes is None else nodes,
            backends=self.cfg.backends,
            capabilities={n: b.capabilities for n, b in self.backends.items()},
        )

    def spec(
        self,
        command: tuple[str, ...],
        *,
        project: str,
        name: str | None = None,
        priority: str | None = None,
        request: ResourceRequest | None = None,
        user: str | None = None,
        **fields: Any,
    ) -> RunSpec:
        """A run spec the way every edge builds one: the current user (``user``: the
        authenticated identity of a server request instead), the config's default class, the
        command as its name when it has none. ``fields``: other ``RunSpec`` fields."""
        return RunSpec(
            name=name or " ".join(command)[:NAME_FROM_COMMAND],
            project=project,
            user=user if user is not None else current_user(),
            command=command,
            request=request or ResourceRequest(),
            priority=priority or self.cfg.default_priority,
            **fields,
        )

    def spec_of(self, req: SubmitRequest, user: str | None = None) -> RunSpec:
        """The spec a local edge (CLI, SDK, Prefect worker) queues for ``req`` (``run_spec``):
        the current user unless ``user``, this config's default class, this process's
        working directory unless it names one."""
        user = user if user is not None else current_user()
        return run_spec(req, user=user, default_priority=self.cfg.default_priority, cwd=os.getcwd())

    def submit(self, spec: RunSpec, *, start_scheduler: bool = False) -> Run:
        """Validate ``spec`` against the config and inventory, then queue it (``_store``)."""
        problems = self.problems(spec)
        if problems:
            raise SubmitError("; ".join(problems))
        return self._store([spec], start_scheduler)[0]

    def submit_many(
        self, specs: list[RunSpec], *, start_scheduler: bool = False, job: JobControl | None = None
    ) -> list[Run]:
        """Validate every spec, then queue them all in one store transaction, or none: the
        SubmitError names each bad spec by its position and name. ``job``: an array, a hold,
        dependencies by name (``controller.jobs``)."""
        nodes = self.nodes()
        bad = []
        # an array's elements differ only in their index: one stands for all
        for i, spec in enumerate(specs[:1] if job is not None and job.array else specs):
            problems = self.problems(spec, nodes)
            if problems:
                bad.append(f"run {i} ({spec.name}): " + "; ".join(problems))
        if bad:
            if job is not None and job.array:  # the elements differ only in their index
                raise SubmitError(bad[0].split(": ", 1)[1])
            raise SubmitError(
                f"{len(bad)} of {len(specs)} runs rejected, none queued: " + " | ".join(bad)
            )
        return self._store(specs, start_scheduler, job)

    def _store(
        self, specs: list[RunSpec], start_scheduler: bool, job: JobControl | None = None
    ) -> list[Run]:
        """Store the runs last, so that a failing submit stores none (``prepare``): the store
        opened, the runs' folders proven writable, a background scheduler started if asked
        (one started for nothing exits when idle), then the runs' rows written."""
        from mlops_gpu.controller.daemon import ensure_scheduler
        from mlops_gpu.controller.prepare import prepare_folders

        store = self.store
        prepare_folders(self.cfg, specs)
        if start_scheduler:
            ensure_scheduler(self)
        try:
            return store.submit_many(specs, job=job)
        except DependencyError as e:
            raise SubmitError(str(e)) from None

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.close()


def current_user() -> str:
    try:
        return os.environ.get("MLOPS_GPU_USER") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return str(os.getuid())
